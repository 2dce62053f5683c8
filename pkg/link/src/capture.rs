//! What a capture of a link end yields: frames as the pod's interface saw them, passed
//! from the wiring (which reads the kernel) to the admin service (which bounds the
//! capture and streams it).

/// One frame seen on the pod's interface of a link end.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CapturedFrame {
    /// When the kernel saw it, in Unix nanoseconds.
    pub unix_nanos: i64,
    /// Sent by the pod into the link (false: delivered to the pod).
    pub outgoing: bool,
    /// Its whole length on the link; more than `data` holds when the snaplen cut it.
    pub original_len: u32,
    /// The frame from its Ethernet header on, cut to the snaplen.
    pub data: Vec<u8>,
}
