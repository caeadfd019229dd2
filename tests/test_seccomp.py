"""The sandbox's seccomp program, checked without a kernel: hand-assembled instructions, a small classic-BPF
evaluator that runs it on `struct seccomp_data` bytes, and the syscall numbers against libseccomp's table.
tests/test_code_task.py loads it into a real sandbox."""

import ctypes
import errno
import struct

import pytest

from ablate.tasks.seccomp import (
    AUDIT_ARCH_X86_64,
    DENY,
    FILTER,
    JEQ,
    JGE,
    JSET,
    LD_ABS_W,
    RET,
    SYSCALLS_X86_64,
    assemble,
    program,
)

ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
SIGCHLD, CLONE_NEWUSER = 17, 0x10000000
THREAD_FLAGS = 0x3D0F00  # glibc pthread_create: CLONE_VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|SETTLS|PARENT_SETTID|...


def run_bpf(prog, nr, args=(), arch=AUDIT_ARCH_X86_64):
    """What the kernel returns for one call: the opcodes the filter uses, nothing else."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))  # struct seccomp_data
    a, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        pc += 1
        if code == LD_ABS_W:
            a = struct.unpack_from("<I", data, k)[0]
        elif code in (JEQ, JGE, JSET):
            hit = {JEQ: a == k, JGE: a >= k, JSET: bool(a & k)}[code]
            pc += jt if hit else jf
        elif code == RET:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


def test_small_program_by_hand():
    prog = program({"ptrace": "deny", "clone3": "enosys"}, SYSCALLS_X86_64)
    assert prog == [
        (0x20, 0, 0, 4),                  # 0: A = arch
        (0x15, 0, 5, 0xC000003E),         # 1: x86_64? else -> 7
        (0x20, 0, 0, 0),                  # 2: A = nr
        (0x35, 3, 0, 0x40000000),         # 3: x32 ABI -> 7
        (0x15, 2, 0, 101),                # 4: ptrace -> 7
        (0x15, 2, 0, 435),                # 5: clone3 -> 8
        (0x06, 0, 0, 0x7FFF0000),         # 6: allow
        (0x06, 0, 0, 0x00050001),         # 7: EPERM
        (0x06, 0, 0, 0x00050026),         # 8: ENOSYS
    ]
    # struct sock_filter, little endian: u16 code, u8 jt, u8 jf, u32 k
    assert assemble(prog[:2]) == bytes.fromhex("2000" "00" "00" "04000000" "1500" "00" "05" "3e0000c0")


def test_argument_bodies_by_hand():
    prog = program({"socket": ("not_equal", 1), "clone": ("any_bit", 0x7E020000)}, SYSCALLS_X86_64)
    assert prog[4:] == [
        (0x15, 3, 0, 41),                 # 4: socket -> 8
        (0x15, 6, 0, 56),                 # 5: clone -> 12
        (0x06, 0, 0, ALLOW),              # 6
        (0x06, 0, 0, EPERM),              # 7: bad arch, x32
        (0x20, 0, 0, 16), (0x15, 1, 0, 1), (0x06, 0, 0, EPERM), (0x06, 0, 0, ALLOW),  # 8: AF_UNIX only
        (0x20, 0, 0, 16), (0x45, 0, 1, 0x7E020000), (0x06, 0, 0, EPERM), (0x06, 0, 0, ALLOW),  # 12
    ]


def test_filter_bytes_are_the_assembled_program():
    prog = program()
    assert FILTER == assemble(prog) and len(FILTER) == 8 * len(prog) and len(prog) < 4096  # BPF_MAXINSNS
    # identical bodies are shared: one EPERM return for every plain denial, the bad arch and x32
    assert sum(insn == (RET, 0, 0, EPERM) for insn in prog) == 3  # plain + socket's + clone's
    jumps = [(pc, jt, jf) for pc, (code, jt, jf, _) in enumerate(prog) if code in (JEQ, JGE, JSET)]
    assert all(pc + 1 + max(jt, jf) < len(prog) for pc, jt, jf in jumps) and prog[-1][0] == RET


@pytest.mark.parametrize("name", sorted(n for n, rule in DENY.items() if rule == "deny"))
def test_every_listed_call_is_refused_with_eperm(name):
    assert run_bpf(program(), SYSCALLS_X86_64[name], (0, 0, 0)) == EPERM


def test_everything_else_is_allowed():
    prog, listed = program(), {SYSCALLS_X86_64[n] for n in DENY}
    for nr in range(0, 470):  # past the newest x86_64 call (~462 in Linux 6.18)
        if nr not in listed:
            assert run_bpf(prog, nr, (2,)) == ALLOW, nr  # read, execve, fork, vfork, prctl, prlimit64, ...


def test_clone_and_socket_depend_on_their_first_argument():
    prog, clone, socket = program(), SYSCALLS_X86_64["clone"], SYSCALLS_X86_64["socket"]
    assert run_bpf(prog, clone, (SIGCHLD,)) == ALLOW            # fork()
    assert run_bpf(prog, clone, (THREAD_FLAGS,)) == ALLOW       # a thread
    assert run_bpf(prog, clone, (1 << 32 | SIGCHLD,)) == ALLOW  # the kernel reads 32-bit flags
    for bit in (0x00020000, 0x02000000, 0x04000000, 0x08000000, CLONE_NEWUSER, 0x20000000, 0x40000000):
        assert run_bpf(prog, clone, (bit | SIGCHLD,)) == EPERM   # NEWNS, NEWCGROUP, NEWUTS, ... NEWNET
    assert run_bpf(prog, SYSCALLS_X86_64["clone3"], (0, 88)) == ENOSYS  # glibc falls back to clone
    assert run_bpf(prog, socket, (1, 1)) == ALLOW               # AF_UNIX
    assert run_bpf(prog, socket, (1 << 32 | 1, 1)) == ALLOW     # still AF_UNIX to the kernel (int)
    for family in (2, 10, 16, 17, 40):                          # INET, INET6, NETLINK, PACKET, VSOCK
        assert run_bpf(prog, socket, (family, 1)) == EPERM


def test_other_abis_are_refused():
    prog = program()
    assert run_bpf(prog, 0x40000000 | 101) == EPERM      # x32 ptrace
    assert run_bpf(prog, 0x40000000 | 0) == EPERM        # even x32 read
    assert run_bpf(prog, 26, arch=0x40000003) == EPERM   # i386 ptrace (int 0x80)
    assert run_bpf(prog, 0, arch=0x40000003) == EPERM    # i386 restart_syscall


def test_syscall_numbers_match_libseccomp():
    # libseccomp2 ships with every Debian (apt depends on it); its table is the kernel's
    lib = ctypes.CDLL("libseccomp.so.2")
    lib.seccomp_syscall_resolve_name_arch.argtypes = (ctypes.c_uint32, ctypes.c_char_p)
    resolved = {n: lib.seccomp_syscall_resolve_name_arch(AUDIT_ARCH_X86_64, n.encode()) for n in SYSCALLS_X86_64}
    assert resolved == SYSCALLS_X86_64
    assert set(DENY) == set(SYSCALLS_X86_64)
