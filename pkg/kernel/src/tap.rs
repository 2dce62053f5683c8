//! TAP devices for wires carried by weftd: created persistent inside a pod's namespace,
//! so the pod keeps its interface while weftd restarts, and reattached by name.
//! Written on libc's ioctls directly: the TAP crates add userspace segmentation or
//! their own I/O model, while a wire only needs the raw frames (with the virtio-net
//! header, so GSO super-frames cross the wire whole).

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use crate::{KernelError, NetNs, in_netns};

/// Size of the virtio-net header in front of every frame (`struct virtio_net_hdr`).
pub const VNET_HDR_LEN: usize = 10;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

fn ioctl(fd: &OwnedFd, req: libc::Ioctl, arg: libc::c_ulong, what: &str) -> Result<(), KernelError> {
    // SAFETY: the requests used here take an integer argument or a pointer to an
    // `IfReq` that outlives the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req, arg) };
    if r < 0 {
        Err(KernelError::os(what.to_string(), std::io::Error::last_os_error()))
    } else {
        Ok(())
    }
}

/// Opens the TAP device `name` inside `ns`, creating it (persistent, with the
/// virtio-net header and checksum/TSO offloads) when it does not exist, attaching to it
/// when it does. The descriptor is non-blocking; the caller configures MAC, address
/// and state through netlink.
pub fn open(ns: &NetNs, name: &str) -> Result<OwnedFd, KernelError> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(KernelError::os(
            format!("TAP name {name:?}"),
            std::io::Error::from_raw_os_error(libc::EINVAL),
        ));
    }
    let name = name.to_string();
    in_netns(ns, move || {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(|e| KernelError::os("opening /dev/net/tun", e))?;
        let fd: OwnedFd = file.into();
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: 0,
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        req.flags = (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short;
        ioctl(
            &fd,
            libc::TUNSETIFF,
            &mut req as *mut IfReq as libc::c_ulong,
            "TUNSETIFF",
        )?;
        ioctl(&fd, libc::TUNSETPERSIST, 1, "TUNSETPERSIST")?;
        let offload = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6;
        ioctl(&fd, libc::TUNSETOFFLOAD, offload as libc::c_ulong, "TUNSETOFFLOAD")?;
        Ok(fd)
    })
}
