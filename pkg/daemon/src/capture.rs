//! The bounds of a link capture (`weftctl capture`, the admin service's `Capture`): the
//! wiring hands over an endless stream of frames; here it is cut to the snaplen and
//! ended by count, bytes or time, whichever comes first, and the number of captures
//! running at once is held down. The daemon bounds every capture even when the client
//! asks for none, so a forgotten `weftctl capture` cannot stream for ever.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use prometheus_client::metrics::gauge::Gauge;
use weft_link::CapturedFrame;
use weft_telemetry::{Families, Metrics};

use crate::seams::FrameStream;

/// Captures that may run at once on one node; one more is refused until one ends.
pub const MAX_CONCURRENT: usize = 8;
/// The longest a capture runs (and how long one runs that names no time).
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 60);
/// The most bytes of frames one capture sends (and what one that names none may send).
pub const MAX_BYTES: u64 = 1 << 30;
/// The most bytes kept of each frame, and the default: a gRPC wire's largest
/// super-frame (256 KiB) whole, and the largest snaplen tcpdump accepts.
pub const MAX_SNAPLEN: u32 = 262_144;

/// How far one capture goes: the client's asks, lowered to the daemon's caps, with the
/// caps where the client asked nothing (zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Frames to send before ending (`None`: bytes and time end it).
    pub max_frames: Option<u64>,
    /// Ends once this many bytes of frames were sent (the frame that reaches it is sent).
    pub max_bytes: u64,
    /// Ends after this long.
    pub max_duration: Duration,
    /// Bytes kept of each frame.
    pub snaplen: u32,
}

impl Bounds {
    /// The bounds for a request's fields (zero: not asked).
    pub fn new(max_frames: u64, max_bytes: u64, max_duration_ms: u64, snaplen: u32) -> Self {
        let capped = |asked: u64, cap: u64| if asked == 0 { cap } else { asked.min(cap) };
        Self {
            max_frames: (max_frames > 0).then_some(max_frames),
            max_bytes: capped(max_bytes, MAX_BYTES),
            max_duration: Duration::from_millis(capped(max_duration_ms, MAX_DURATION.as_millis() as u64)),
            snaplen: capped(u64::from(snaplen), u64::from(MAX_SNAPLEN)) as u32,
        }
    }
}

/// The capture families: how many captures run now.
struct CaptureMetrics {
    active: Gauge,
}

impl Families for CaptureMetrics {
    fn register(metrics: &Metrics) -> Self {
        let active = Gauge::default();
        metrics.register(
            "weft_captures_active",
            "Link captures (weftctl capture) running on this node",
            active.clone(),
        );
        Self { active }
    }
}

/// The captures running on this node, at most [`MAX_CONCURRENT`] at once (shared by
/// clones).
#[derive(Debug, Clone)]
pub struct Captures {
    active: Arc<AtomicUsize>,
    max: usize,
    gauge: Option<Gauge>,
}

impl Default for Captures {
    fn default() -> Self {
        Self::new(MAX_CONCURRENT)
    }
}

impl Captures {
    /// Allows `max` captures at once.
    pub fn new(max: usize) -> Self {
        Self {
            active: Arc::new(AtomicUsize::new(0)),
            max,
            gauge: None,
        }
    }

    /// Shows how many run in `metrics` (`weft_captures_active`).
    pub fn with_metrics(mut self, metrics: &Metrics) -> Self {
        self.gauge = Some(metrics.families::<CaptureMetrics>().active.clone());
        self
    }

    /// How many run now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// The most that may run at once.
    pub fn max(&self) -> usize {
        self.max
    }

    /// A place for one more capture, held until the permit is dropped; `None` when
    /// [`max`](Self::max) run already.
    pub fn try_start(&self) -> Option<Permit> {
        self.active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max).then_some(n + 1))
            .ok()?;
        if let Some(g) = &self.gauge {
            g.inc();
        }
        Some(Permit { captures: self.clone() })
    }
}

/// One running capture's place among [`Captures`]; given back on drop.
#[derive(Debug)]
pub struct Permit {
    captures: Captures,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.captures.active.fetch_sub(1, Ordering::AcqRel);
        if let Some(g) = &self.captures.gauge {
            g.dec();
        }
    }
}

/// A capture on its way: what it has sent, and what ends it.
struct Running {
    frames: FrameStream,
    bounds: Bounds,
    deadline: Pin<Box<tokio::time::Sleep>>,
    started: Instant,
    sent_frames: u64,
    sent_bytes: u64,
    failed: bool,
    what: String,
    _permit: Permit,
}

impl Running {
    /// Whether a count or byte bound is reached (time is the deadline's).
    fn full(&self) -> bool {
        self.bounds.max_frames.is_some_and(|m| self.sent_frames >= m) || self.sent_bytes >= self.bounds.max_bytes
    }
}

impl Drop for Running {
    // Dropped however the capture ends, a client gone included: the one place that
    // sees them all.
    fn drop(&mut self) {
        tracing::info!(
            capture = %self.what,
            frames = self.sent_frames,
            bytes = self.sent_bytes,
            secs = self.started.elapsed().as_secs_f64(),
            "capture ended"
        );
    }
}

/// `frames` within `bounds`: each cut to the snaplen, ended by count, bytes or time, or
/// after the first error (which is passed on). Dropping the stream (the client went
/// away) drops `frames`, which closes the capture, and gives `permit` back. `what`
/// names the capture in the log.
pub fn bounded(
    frames: FrameStream,
    bounds: Bounds,
    permit: Permit,
    what: String,
) -> impl Stream<Item = std::io::Result<CapturedFrame>> + Send + 'static {
    let running = Running {
        frames,
        bounds,
        deadline: Box::pin(tokio::time::sleep(bounds.max_duration)),
        started: Instant::now(),
        sent_frames: 0,
        sent_bytes: 0,
        failed: false,
        what,
        _permit: permit,
    };
    futures::stream::unfold(running, |mut r| async move {
        if r.failed || r.full() {
            return None;
        }
        let next = tokio::select! {
            () = &mut r.deadline => return None,
            next = r.frames.next() => next,
        };
        match next? {
            Ok(mut f) => {
                f.data.truncate(r.bounds.snaplen as usize);
                r.sent_frames += 1;
                r.sent_bytes += f.data.len() as u64;
                Some((Ok(f), r))
            }
            Err(e) => {
                r.failed = true;
                Some((Err(e), r))
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(len: usize) -> CapturedFrame {
        CapturedFrame {
            unix_nanos: 1,
            outgoing: true,
            original_len: len as u32,
            data: vec![0xab; len],
        }
    }

    /// An endless stream of `len`-byte frames.
    fn endless(len: usize) -> FrameStream {
        futures::stream::repeat_with(move || Ok(frame(len))).boxed()
    }

    async fn collect(frames: FrameStream, bounds: Bounds, captures: &Captures) -> Vec<std::io::Result<CapturedFrame>> {
        let permit = captures.try_start().unwrap();
        let s = bounded(frames, bounds, permit, "test".into());
        tokio::time::timeout(Duration::from_secs(5), s.collect::<Vec<_>>())
            .await
            .expect("the capture ended in time")
    }

    #[test]
    fn unasked_bounds_are_the_caps_and_asks_above_them_are_lowered() {
        let b = Bounds::new(0, 0, 0, 0);
        assert_eq!(
            b,
            Bounds {
                max_frames: None,
                max_bytes: MAX_BYTES,
                max_duration: MAX_DURATION,
                snaplen: MAX_SNAPLEN,
            }
        );
        let b = Bounds::new(5, u64::MAX, u64::MAX, u32::MAX);
        assert_eq!(
            (b.max_frames, b.max_bytes, b.max_duration),
            (Some(5), MAX_BYTES, MAX_DURATION)
        );
        assert_eq!(b.snaplen, MAX_SNAPLEN);
        let b = Bounds::new(0, 1000, 1500, 96);
        assert_eq!(
            (b.max_bytes, b.max_duration, b.snaplen),
            (1000, Duration::from_millis(1500), 96)
        );
    }

    #[tokio::test]
    async fn a_count_ends_the_capture_and_frames_are_cut_to_the_snaplen() {
        let captures = Captures::default();
        let got = collect(endless(100), Bounds::new(3, 0, 0, 10), &captures).await;
        assert_eq!(got.len(), 3);
        for f in got {
            let f = f.unwrap();
            assert_eq!(
                (f.data.len(), f.original_len),
                (10, 100),
                "the whole length stays known"
            );
        }
        assert_eq!(captures.active(), 0, "an ended capture gives its place back");
    }

    #[tokio::test]
    async fn bytes_end_the_capture_with_the_frame_that_reaches_them() {
        let got = collect(endless(100), Bounds::new(0, 250, 0, 0), &Captures::default()).await;
        assert_eq!(got.len(), 3, "100 + 100 + 100 reaches 250");
    }

    #[tokio::test]
    async fn time_ends_a_capture_that_sees_nothing() {
        let start = Instant::now();
        let got = collect(
            futures::stream::pending().boxed(),
            Bounds::new(10, 0, 100, 0),
            &Captures::default(),
        )
        .await;
        assert!(got.is_empty());
        assert!(start.elapsed() >= Duration::from_millis(100), "{:?}", start.elapsed());
    }

    #[tokio::test]
    async fn an_error_is_passed_on_and_ends_the_capture() {
        let frames = futures::stream::iter([
            Ok(frame(10)),
            Err(std::io::Error::from_raw_os_error(libc::ENETDOWN)),
            Ok(frame(10)),
        ])
        .chain(futures::stream::pending())
        .boxed();
        let got = collect(frames, Bounds::new(0, 0, 0, 0), &Captures::default()).await;
        assert_eq!(got.len(), 2);
        assert!(got[0].is_ok());
        assert_eq!(got[1].as_ref().unwrap_err().raw_os_error(), Some(libc::ENETDOWN));
    }

    /// A frame source that records when it is dropped (the capture socket closing).
    struct Source(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Source {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_client_gone_closes_the_source_and_frees_its_place() {
        let captures = Captures::new(2);
        let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let source = Source(closed.clone());
        let frames = futures::stream::repeat_with(move || {
            let _keep = &source;
            Ok(frame(10))
        })
        .boxed();
        let first = bounded(
            frames,
            Bounds::new(0, 0, 0, 0),
            captures.try_start().unwrap(),
            "a".into(),
        );
        let second = captures.try_start().unwrap();
        assert_eq!(captures.active(), 2);
        assert!(captures.try_start().is_none(), "a third is refused");
        let mut first = Box::pin(first);
        assert!(first.next().await.unwrap().is_ok());
        drop(first);
        assert!(closed.load(Ordering::SeqCst), "the source is closed with the stream");
        assert_eq!(captures.active(), 1);
        drop(second);
        assert_eq!(captures.active(), 0);
        assert!(captures.try_start().is_some());
    }

    #[test]
    fn the_gauge_follows_the_captures() {
        let metrics = Metrics::new("test", "none");
        let captures = Captures::default().with_metrics(&metrics);
        let p = captures.try_start().unwrap();
        let (_, text) = metrics.render("");
        assert!(text.contains("weft_captures_active 1"), "{text}");
        drop(p);
        let (_, text) = metrics.render("");
        assert!(text.contains("weft_captures_active 0"), "{text}");
    }
}
