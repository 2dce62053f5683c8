//! `weftctl capture`: the frames of one link end, streamed by the daemon that owns it
//! (the admin service's `Capture`), written as pcapng to a file or to standard output
//! (`| tcpdump -r -`, `| wireshark -k -i -`). Each frame is flushed as it comes, so a
//! reader downstream sees it live; however the capture ends (its bounds, Ctrl-C, the
//! reader gone) the output is a whole pcapng file.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use pcap_file::DataLink;
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption};
use weft_rpc::admin::admin_client::AdminClient;
use weft_rpc::admin::{CaptureRequest, CapturedFrame, LinkRef};

use super::link::Target;

/// `weftctl capture` arguments.
#[derive(Debug, Clone, Args)]
pub struct CaptureArgs {
    /// The pod.
    pod: String,
    /// Its interface (the link's end in it).
    intf: String,
    /// With --lab: ask this lab node's daemon rather than the pod's node's.
    #[arg(long)]
    node: Option<String>,
    /// Write pcapng to FILE (`-`, or no -w: standard output).
    #[arg(short = 'w', long = "write", value_name = "FILE")]
    write: Option<PathBuf>,
    /// End after this many frames (default: the daemon's byte and time bounds).
    #[arg(long, short = 'c')]
    count: Option<u64>,
    /// End after this long (e.g. 10s, 2m; default and most: the daemon's 10 minutes).
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Bytes kept of each frame (default and most: 262144).
    #[arg(long)]
    snaplen: Option<u32>,
    #[command(flatten)]
    target: Target,
}

/// The pcapng `if_tsresol` for nanoseconds: pcap-file 2 writes every timestamp in
/// nanoseconds, so the interface must say so (without it readers take microseconds).
const NANOSECONDS: u8 = 9;

/// `epb_flags` direction bits (pcapng, Enhanced Packet Block flags: 01 inbound,
/// 10 outbound).
const INBOUND: u32 = 1;
const OUTBOUND: u32 = 2;

/// A pcapng stream of one interface: the section header, one interface description
/// (Ethernet, the snaplen, nanosecond timestamps, named `POD:INTF`), then an enhanced
/// packet block per frame with its direction. Flushed after each frame.
pub struct PcapNg<W: Write> {
    out: PcapNgWriter<W>,
    /// Frames written.
    pub frames: u64,
    /// Bytes of frames written (as captured, cut to the snaplen).
    pub bytes: u64,
}

impl<W: Write> PcapNg<W> {
    /// Starts the file on `out` for interface `name` with `snaplen`.
    pub fn new(out: W, name: &str, snaplen: u32) -> anyhow::Result<Self> {
        let mut out = PcapNgWriter::new(out).context("writing the pcapng section header")?;
        out.write_pcapng_block(InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            snaplen,
            options: vec![
                InterfaceDescriptionOption::IfName(name.to_string().into()),
                InterfaceDescriptionOption::IfTsResol(NANOSECONDS),
            ],
        })
        .context("writing the pcapng interface description")?;
        out.get_mut().flush().context("flushing the capture")?;
        Ok(Self {
            out,
            frames: 0,
            bytes: 0,
        })
    }

    /// Writes one frame and flushes it.
    pub fn write(&mut self, f: &CapturedFrame) -> Result<(), pcap_file::PcapError> {
        let direction = if f.outgoing { OUTBOUND } else { INBOUND };
        self.out.write_pcapng_block(EnhancedPacketBlock {
            interface_id: 0,
            timestamp: Duration::from_nanos(u64::try_from(f.unix_nanos).unwrap_or(0)),
            original_len: f.original_length.max(f.data.len() as u32),
            data: f.data.as_slice().into(),
            options: vec![EnhancedPacketOption::Flags(direction)],
        })?;
        self.out.get_mut().flush().map_err(pcap_file::PcapError::IoError)?;
        self.frames += 1;
        self.bytes += f.data.len() as u64;
        Ok(())
    }
}

/// Whether a write failed because the reader went away (`| tcpdump -c 5` exiting): the
/// capture then ends as if asked to.
fn reader_gone(e: &pcap_file::PcapError) -> bool {
    matches!(e, pcap_file::PcapError::IoError(io) if io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// The daemon to ask: `--node`'s in the lab, the pod's node's in the lab, or `socket`.
fn daemon(socket: &Path, args: &CaptureArgs) -> anyhow::Result<PathBuf> {
    let Some(node) = &args.node else {
        return Ok(super::link::sockets(socket, &args.target, Some(&args.pod))?.remove(0));
    };
    let Some(file) = &args.target.lab else {
        bail!("--node names a node of a lab: give --lab FILE too (or --socket PATH for any daemon)");
    };
    let lab = weft_lab::Lab::load(file).with_context(|| format!("loading lab {}", file.display()))?;
    if !lab.spec.nodes.iter().any(|n| &n.name == node) {
        bail!("node {node} is not in lab {}", file.display());
    }
    Ok(lab.socket(node))
}

/// Why the capture ended, for the summary.
enum Ended {
    Daemon,
    Interrupted,
    ReaderGone,
}

/// Runs `weftctl capture` against the daemon it names.
pub async fn run(args: CaptureArgs, socket: &Path) -> anyhow::Result<()> {
    let socket = daemon(socket, &args)?;
    let name = format!("{}:{}", args.pod, args.intf);
    let req = CaptureRequest {
        link: Some(LinkRef {
            namespace: args.target.namespace.clone().unwrap_or_default(),
            pod: args.pod.clone(),
            intf: args.intf.clone(),
        }),
        max_frames: args.count.unwrap_or(0),
        max_bytes: 0,
        max_duration_ms: args.duration.map_or(0, |d| d.as_millis().max(1) as u64),
        snaplen: args.snaplen.unwrap_or(0),
    };
    if args.count == Some(0) {
        bail!("--count must be at least 1");
    }
    let to_stdout = args.write.as_deref().is_none_or(|p| p == Path::new("-"));
    if to_stdout && std::io::stdout().is_terminal() {
        bail!("pcapng is not for a terminal: write it to a file (-w FILE) or a pipe (| tcpdump -nn -r -)");
    }
    let mut client = AdminClient::new(super::connect(&socket).await?);
    let mut frames = client
        .capture(req)
        .await
        .map_err(|s| anyhow::anyhow!("cannot capture {name}: {}", s.message()))?
        .into_inner();
    let snaplen = match args.snaplen {
        Some(n) if n > 0 => n.min(262_144),
        _ => 262_144,
    };
    let out: Box<dyn Write> = match args.write.as_deref() {
        Some(p) if !to_stdout => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        _ => Box::new(std::io::stdout()),
    };
    let mut pcap = PcapNg::new(out, &name, snaplen)?;
    // The daemon holds the socket open from here on: a script may start its traffic.
    eprintln!(
        "weftctl: capturing {name} ({}; Ctrl-C ends it)",
        bounds_text(args.count, args.duration)
    );
    // Listening for the whole capture, so a signal between two frames is not missed.
    use tokio::signal::unix::{SignalKind, signal};
    let (mut int, mut term) = (signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?);
    let mut failure = None;
    let ended = loop {
        let next = tokio::select! {
            _ = int.recv() => break Ended::Interrupted,
            _ = term.recv() => break Ended::Interrupted,
            next = frames.message() => next,
        };
        match next {
            Ok(Some(f)) => match pcap.write(&f) {
                Ok(()) => {}
                Err(e) if reader_gone(&e) => break Ended::ReaderGone,
                Err(e) => {
                    failure = Some(anyhow::anyhow!("writing the capture: {e}"));
                    break Ended::Daemon;
                }
            },
            Ok(None) => break Ended::Daemon,
            Err(s) => {
                failure = Some(anyhow::anyhow!("capture of {name}: {}", s.message()));
                break Ended::Daemon;
            }
        }
    };
    drop(frames);
    let why = match ended {
        Ended::Daemon => "",
        Ended::Interrupted => ", interrupted",
        Ended::ReaderGone => ", the reader went away",
    };
    eprintln!(
        "weftctl: {} frames, {} bytes captured on {name}{why}",
        pcap.frames, pcap.bytes
    );
    failure.map_or(Ok(()), Err)
}

/// The bounds asked, for people.
fn bounds_text(count: Option<u64>, duration: Option<Duration>) -> String {
    let count = count.map_or("no frame count".to_string(), |n| format!("up to {n} frames"));
    let time = duration.map_or("at most 10 minutes".to_string(), |d| {
        format!("for at most {}", humantime::format_duration(d))
    });
    format!("{count}, {time}")
}

#[cfg(test)]
mod tests {
    use pcap_file::pcapng::{Block, PcapNgReader};

    use super::*;

    #[test]
    fn frames_read_back_with_their_time_length_and_direction() {
        let mut buf = Vec::new();
        {
            let mut pcap = PcapNg::new(&mut buf, "r1:e1", 96).unwrap();
            for (i, outgoing) in [(0u8, true), (1, false)] {
                pcap.write(&CapturedFrame {
                    unix_nanos: 1_700_000_000_123_456_789 + i64::from(i),
                    outgoing,
                    original_length: 1500,
                    data: vec![i; 96],
                })
                .unwrap();
            }
            assert_eq!((pcap.frames, pcap.bytes), (2, 192));
        }
        let mut r = PcapNgReader::new(buf.as_slice()).unwrap();
        let mut blocks = Vec::new();
        while let Some(b) = r.next_block() {
            blocks.push(b.unwrap().into_owned());
        }
        let Block::InterfaceDescription(idb) = &blocks[0] else {
            panic!("{:?}", blocks[0])
        };
        assert_eq!((idb.linktype, idb.snaplen), (DataLink::ETHERNET, 96));
        assert!(idb.options.contains(&InterfaceDescriptionOption::IfTsResol(9)));
        let epbs: Vec<_> = blocks[1..]
            .iter()
            .map(|b| match b {
                Block::EnhancedPacket(e) => e.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(epbs.len(), 2);
        assert_eq!(epbs[0].timestamp, Duration::from_nanos(1_700_000_000_123_456_789));
        assert_eq!((epbs[0].original_len, epbs[0].data.len()), (1500, 96));
        assert_eq!(epbs[0].options, vec![EnhancedPacketOption::Flags(OUTBOUND)]);
        assert_eq!(epbs[1].options, vec![EnhancedPacketOption::Flags(INBOUND)]);
        assert_eq!(epbs[1].data[0], 1);
    }

    #[test]
    fn a_reader_gone_is_a_clean_end() {
        let gone = pcap_file::PcapError::IoError(std::io::ErrorKind::BrokenPipe.into());
        assert!(reader_gone(&gone));
        let full = pcap_file::PcapError::IoError(std::io::Error::from_raw_os_error(28));
        assert!(!reader_gone(&full));
    }

    #[test]
    fn node_needs_a_lab() {
        let args = CaptureArgs {
            pod: "r1".into(),
            intf: "e1".into(),
            node: Some("n2".into()),
            write: None,
            count: None,
            duration: None,
            snaplen: None,
            target: Target {
                lab: None,
                namespace: None,
            },
        };
        let e = daemon(Path::new("/run/weft/weftd.sock"), &args).unwrap_err();
        assert!(e.to_string().contains("--lab"), "{e}");
        let args = CaptureArgs { node: None, ..args };
        assert_eq!(
            daemon(Path::new("/run/weft/weftd.sock"), &args).unwrap(),
            Path::new("/run/weft/weftd.sock")
        );
    }
}
