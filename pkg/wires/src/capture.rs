//! The frames of a link capture as a stream (`weftctl capture`): the kernel's capture
//! socket on the end's interface in the pod, read as frames arrive. It lives here, beside
//! the data plane, because registering a socket with Tokio's reactor is `unsafe`, which
//! this crate allows in its own small places and the node's crates do not at all.

use futures::StreamExt;
use futures::stream::BoxStream;
use weft_kernel::capture::CaptureSocket;
use weft_link::CapturedFrame;

/// The frames of capture socket `sock`, each read into a buffer of `snaplen` bytes (the
/// kernel copies no more), as they come; an error (the interface went away) is passed
/// on. The socket closes when the stream is dropped. Call it inside the runtime that
/// will read the stream.
pub fn frames(
    sock: CaptureSocket,
    snaplen: u32,
) -> std::io::Result<BoxStream<'static, std::io::Result<CapturedFrame>>> {
    let fd = sock.into_async()?;
    let buf = vec![0u8; snaplen.max(1) as usize];
    Ok(futures::stream::unfold((fd, buf), |(fd, mut buf)| async move {
        let got = loop {
            let mut ready = match fd.readable().await {
                Ok(r) => r,
                Err(e) => break Err(e),
            };
            if let Ok(r) = ready.try_io(|s| s.get_ref().recv(&mut buf)) {
                break r;
            }
        };
        let frame = got.map(|c| CapturedFrame {
            unix_nanos: c.unix_nanos,
            outgoing: c.outgoing,
            original_len: u32::try_from(c.original_len).unwrap_or(u32::MAX),
            data: buf[..c.len].to_vec(),
        });
        Some((frame, (fd, buf)))
    })
    .boxed())
}
