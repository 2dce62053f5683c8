//! The two tc programs of a link detour (see [`crate::detour`]), assembled here and
//! loaded with `bpf(2)`.
//!
//! Hand-assembled rather than compiled: each program is under a dozen instructions with
//! an interface index baked in, and the crates that load BPF (aya, libbpf-rs) load ELF
//! objects that a BPF compiler (clang) must produce, which neither the build machines
//! nor CI have. The kernel's verifier checks every program before it runs.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// The `skb->mark` a frame carries while weftd hands it back to its interface, so the
/// steering program lets it out instead of steering it again ("weft" in ASCII).
pub const RETURN_MARK: u32 = 0x7765_6674;

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}

// Opcodes from <linux/bpf.h> and <linux/bpf_common.h>.
/// `BPF_LDX | BPF_MEM | BPF_W`: a 32-bit load.
const LDX_W: u8 = 0x61;
/// `BPF_STX | BPF_MEM | BPF_W`: a 32-bit store.
const STX_W: u8 = 0x63;
/// `BPF_ALU64 | BPF_MOV | BPF_K`: a register gets an immediate.
const MOV_K: u8 = 0xb7;
/// `BPF_JMP | BPF_JNE | BPF_K`: jump when a register differs from an immediate.
const JNE_K: u8 = 0x55;
/// `BPF_JMP | BPF_CALL`.
const CALL: u8 = 0x85;
/// `BPF_JMP | BPF_EXIT`.
const EXIT: u8 = 0x95;
/// `BPF_FUNC_redirect`.
const FN_REDIRECT: i32 = 23;
/// `offsetof(struct __sk_buff, mark)`.
const MARK: i16 = 8;
/// `TC_ACT_OK`: the frame goes on as if no program had seen it.
const TC_ACT_OK: i32 = 0;

/// For an interface's egress: a frame without [`RETURN_MARK`] is redirected out of
/// interface `detour` (to weftd); one with it has the mark cleared and goes out.
pub fn steer(detour: u32) -> Vec<Insn> {
    vec![
        insn(LDX_W, 2, 1, MARK, 0),               // r2 = skb->mark
        insn(JNE_K, 2, 0, 4, RETURN_MARK as i32), // if r2 != RETURN_MARK goto redirect
        insn(MOV_K, 2, 0, 0, 0),                  // r2 = 0
        insn(STX_W, 1, 2, MARK, 0),               // skb->mark = r2
        insn(MOV_K, 0, 0, 0, TC_ACT_OK),          // return TC_ACT_OK
        insn(EXIT, 0, 0, 0, 0),                   //
        insn(MOV_K, 1, 0, 0, detour as i32),      // redirect: r1 = detour
        insn(MOV_K, 2, 0, 0, 0),                  // r2 = 0 (egress)
        insn(CALL, 0, 0, 0, FN_REDIRECT),         // r0 = bpf_redirect(r1, r2)
        insn(EXIT, 0, 0, 0, 0),                   // return r0
    ]
}

/// For the detour's ingress: every frame (weftd's, handed back) gets [`RETURN_MARK`]
/// and is redirected out of interface `intf`, the link it was steered away from.
pub fn hand_back(intf: u32) -> Vec<Insn> {
    vec![
        insn(MOV_K, 2, 0, 0, RETURN_MARK as i32), // r2 = RETURN_MARK
        insn(STX_W, 1, 2, MARK, 0),               // skb->mark = r2
        insn(MOV_K, 1, 0, 0, intf as i32),        // r1 = intf
        insn(MOV_K, 2, 0, 0, 0),                  // r2 = 0 (egress)
        insn(CALL, 0, 0, 0, FN_REDIRECT),         // r0 = bpf_redirect(r1, r2)
        insn(EXIT, 0, 0, 0, 0),                   // return r0
    ]
}

/// `union bpf_attr` as `BPF_PROG_LOAD` reads it (the fields up to the ones used).
#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
/// Room for the verifier's explanation when a program is refused.
const LOG_SIZE: usize = 16 * 1024;

/// Loads `prog` as a tc classifier named `name` (at most 15 characters); the verifier's
/// log is in the error when the kernel refuses it.
pub fn load_sched_cls(prog: &[Insn], name: &str) -> io::Result<OwnedFd> {
    let license = c"Apache-2.0";
    let mut prog_name = [0u8; 16];
    for (d, s) in prog_name.iter_mut().zip(name.bytes().take(15)) {
        *d = s;
    }
    let mut log = vec![0u8; LOG_SIZE];
    for log_level in [0, 1] {
        let mut attr = ProgLoad {
            prog_type: BPF_PROG_TYPE_SCHED_CLS,
            insn_cnt: prog.len() as u32,
            insns: prog.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level,
            log_size: 0,
            log_buf: 0,
            kern_version: 0,
            prog_flags: 0,
            prog_name,
        };
        if log_level > 0 {
            attr.log_size = LOG_SIZE as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
        }
        // SAFETY: `attr` and everything it points to (the instructions, the license,
        // the log buffer of the size given) live across the call; the kernel reads
        // `size_of::<ProgLoad>()` bytes of `attr`.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_LOAD,
                &attr as *const ProgLoad,
                std::mem::size_of::<ProgLoad>(),
            )
        };
        if fd >= 0 {
            // SAFETY: a fresh descriptor the kernel just returned; nothing else owns it.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
        let e = io::Error::last_os_error();
        let refused = matches!(e.raw_os_error(), Some(libc::EACCES | libc::EINVAL));
        if refused && log_level == 0 {
            // Loaded again with the verifier's log, to say why.
            continue;
        }
        if refused {
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            return Err(io::Error::new(e.kind(), format!("{e}; verifier: {}", text.trim())));
        }
        return Err(e);
    }
    unreachable!("the second attempt returns")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steering_jump_lands_on_the_redirect() {
        let p = steer(7);
        let jump = 1;
        let target = jump + 1 + p[jump].off as usize;
        assert_eq!((p[target].code, p[target].regs, p[target].imm), (MOV_K, 1, 7));
        assert_eq!(p.last().map(|i| i.code), Some(EXIT));
        assert_eq!(std::mem::size_of::<Insn>(), 8);
    }

    #[test]
    fn handing_back_marks_then_redirects_to_the_link() {
        let p = hand_back(42);
        assert_eq!((p[0].imm, p[1].code, p[1].off), (RETURN_MARK as i32, STX_W, MARK));
        assert_eq!((p[2].imm, p[4].imm), (42, FN_REDIRECT));
    }
}
