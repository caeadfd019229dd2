"""The seccomp filter of the code sandbox: a classic-BPF program built here from a small deny-list.

bubblewrap loads it (`--seccomp FD`) as the last step before it runs the harness, so the harness and the
untrusted child (and every process they start) inherit it. Default allow; each denied call returns an
errno instead of killing, so Python code sees an ordinary `OSError` and fails cleanly. The deny-list holds
what Docker's default profile, nsjail and firejail block and test code never needs: debugging other
processes, namespaces and mounts (the usual first steps of a container escape, e.g. a fresh user
namespace that grants capabilities inside it), kernel keyrings, eBPF, perf, io_uring, modules, kexec,
reboot, swap, clocks. Networking is already unshared; `socket` is refused for every family but AF_UNIX.

The program (x86_64 only; offsets into `struct seccomp_data`: nr at 0, arch at 4, args[i] at 16 + 8i):

    ld arch;  jeq AUDIT_ARCH_X86_64 else -> EPERM    (i386 `int 0x80` has other numbers: refuse it)
    ld nr;    jge X32_SYSCALL_BIT -> EPERM            (the x32 ABI aliases every call: refuse it)
    jeq nr_1 -> body_1;  jeq nr_2 -> body_2; ...      (one dispatch line per listed call)
    ret ALLOW
    body: ret ERRNO  |  ld arg0_lo; test; ret ERRNO; ret ALLOW    (identical bodies are shared)

`clone3` answers ENOSYS (its flags live in user memory, out of a filter's reach), so glibc falls back to
`clone`, whose flags are checked: a new namespace of any kind is refused, plain forks and threads pass.
Only the low 32 bits of an argument are tested: the kernel reads `clone` flags and the `socket` family as
32-bit values. Kernel reference: Documentation/userspace-api/seccomp_filter.rst; the deny-list follows
the Docker/moby default profile (github.com/moby/profiles) and nsjail's examples.
"""

from __future__ import annotations

import errno
import os
import struct

# classic BPF opcodes (linux/bpf_common.h) and seccomp return values (linux/seccomp.h)
LD_ABS_W = 0x20   # BPF_LD | BPF_W | BPF_ABS: A = 32-bit word at offset k of seccomp_data
JEQ = 0x15        # BPF_JMP | BPF_JEQ | BPF_K: pc += jt if A == k else jf
JGE = 0x35        # BPF_JMP | BPF_JGE | BPF_K: pc += jt if A >= k else jf
JSET = 0x45       # BPF_JMP | BPF_JSET | BPF_K: pc += jt if A & k else jf
RET = 0x06        # BPF_RET | BPF_K: return k
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000  # | errno in the low 16 bits
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
OFF_NR, OFF_ARCH, OFF_ARG0 = 0, 4, 16

CLONE_NAMESPACES = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
AF_UNIX = 1

# x86_64 numbers (arch/x86/entry/syscalls/syscall_64.tbl; tests check them against libseccomp)
SYSCALLS_X86_64 = {
    "socket": 41, "clone": 56, "ptrace": 101, "syslog": 103, "uselib": 134, "personality": 135,
    "adjtimex": 159, "chroot": 161, "acct": 163, "settimeofday": 164, "mount": 165, "umount2": 166,
    "swapon": 167, "swapoff": 168, "reboot": 169, "iopl": 172, "ioperm": 173, "init_module": 175,
    "delete_module": 176, "quotactl": 179, "pivot_root": 155, "clock_settime": 227, "kexec_load": 246,
    "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298,
    "fanotify_init": 300, "name_to_handle_at": 303, "open_by_handle_at": 304, "clock_adjtime": 305,
    "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "finit_module": 313,
    "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "clone3": 435, "pidfd_getfd": 438, "process_madvise": 440,
    "mount_setattr": 442,
}

# name -> rule: "deny" (EPERM), "enosys", or (test, k) on the low word of arg 0, denied when it holds
DENY: dict[str, str | tuple[str, int]] = {
    **{name: "deny" for name in (
        "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise",
        "personality", "userfaultfd",                                    # other processes' memory
        "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount",
        "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",     # namespaces and mounts
        "name_to_handle_at", "open_by_handle_at",                        # file handles past mounts
        "keyctl", "add_key", "request_key",                              # kernel keyrings
        "bpf", "perf_event_open", "io_uring_setup", "io_uring_enter", "io_uring_register",
        "fanotify_init", "syslog", "uselib", "acct", "quotactl", "iopl", "ioperm",
        "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
        "swapon", "swapoff", "settimeofday", "clock_settime", "adjtimex", "clock_adjtime")},
    "clone": ("any_bit", CLONE_NAMESPACES),   # a new namespace of any kind
    "socket": ("not_equal", AF_UNIX),         # any family but AF_UNIX
    "clone3": "enosys",                       # glibc then falls back to clone
}

Insn = tuple[int, int, int, int]  # (code, jt, jf, k): one `struct sock_filter`


def _body(rule: str | tuple[str, int]) -> tuple[Insn, ...]:
    deny = (RET, 0, 0, RET_ERRNO | errno.EPERM)
    if rule == "deny":
        return (deny,)
    if rule == "enosys":
        return ((RET, 0, 0, RET_ERRNO | errno.ENOSYS),)
    test, k = rule
    # after the test: jt / jf are relative to the next instruction (0: deny, 1: allow)
    check = {"any_bit": (JSET, 0, 1, k), "not_equal": (JEQ, 1, 0, k)}[test]
    return ((LD_ABS_W, 0, 0, OFF_ARG0), check, deny, (RET, 0, 0, RET_ALLOW))


def program(deny: dict[str, str | tuple[str, int]] = DENY,
            numbers: dict[str, int] = SYSCALLS_X86_64) -> list[Insn]:
    """The filter as a list of BPF instructions (pure; see the module docstring for its layout)."""
    rules = sorted((numbers[name], _body(rule)) for name, rule in deny.items())  # [(nr, body)]
    bodies: list[tuple[Insn, ...]] = [((RET, 0, 0, RET_ERRNO | errno.EPERM),)]  # [0]: bad arch, x32
    for _, body in rules:
        if body not in bodies:
            bodies.append(body)
    head = 4 + len(rules) + 1                    # arch check, x32 check, dispatch lines, ret ALLOW
    start, at = [], head
    for body in bodies:
        start.append(at)
        at += len(body)
    prog: list[Insn] = [
        (LD_ABS_W, 0, 0, OFF_ARCH), (JEQ, 0, start[0] - 2, AUDIT_ARCH_X86_64),
        (LD_ABS_W, 0, 0, OFF_NR), (JGE, start[0] - 4, 0, X32_SYSCALL_BIT),
    ]
    for nr, body in rules:
        prog.append((JEQ, start[bodies.index(body)] - len(prog) - 1, 0, nr))
    prog.append((RET, 0, 0, RET_ALLOW))
    for body in bodies:
        prog.extend(body)
    if max(max(jt, jf) for _, jt, jf, _ in prog) > 255:
        raise ValueError("seccomp program too long for 8-bit jump offsets")
    return prog


def assemble(prog: list[Insn]) -> bytes:
    """The bytes bubblewrap reads: one little-endian `struct sock_filter` (u16, u8, u8, u32) each."""
    return b"".join(struct.pack("<HBBI", *insn) for insn in prog)


def supported() -> str | None:
    """None when the filter fits this machine, else the reason."""
    machine = os.uname().machine
    return None if machine == "x86_64" else f"the seccomp filter is written for x86_64, not {machine}"


FILTER = assemble(program())
