//! Tests of `packet`.

use std::os::unix::net::UnixDatagram;

use bytes::BytesMut;

use super::*;

/// Two connected datagram sockets standing in for a packet socket and the pod: each
/// write is one message and each read takes one, as on the node end.
fn pair() -> (PacketSocket, UnixDatagram) {
    let (a, b) = UnixDatagram::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    (PacketSocket { fd: a.into() }, b)
}

#[test]
fn reads_one_frame_at_a_time_and_would_block_when_none_waits() {
    let (sock, pod) = pair();
    pod.send(b"first").unwrap();
    pod.send(b"second frame").unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(sock.read(&mut buf).unwrap(), 5);
    assert_eq!(&buf[..5], b"first");
    assert_eq!(sock.read(&mut buf).unwrap(), 12);
    assert_eq!(&buf[..12], b"second frame");
    let e = sock.read(&mut buf).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
}

#[test]
fn read_buf_appends_each_frame_behind_the_last() {
    let (sock, pod) = pair();
    pod.send(b"abc").unwrap();
    pod.send(b"defgh").unwrap();
    let mut buf = BytesMut::with_capacity(MAX_FRAME * 2);
    assert_eq!(sock.read_buf(&mut buf).unwrap(), 3);
    let first = buf.split().freeze();
    assert_eq!(sock.read_buf(&mut buf).unwrap(), 5);
    assert_eq!(&first[..], b"abc");
    assert_eq!(&buf[..], b"defgh");
    let e = sock.read_buf(&mut buf).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    assert_eq!(buf.len(), 5, "a failed read adds nothing");
}

#[test]
fn read_buf_takes_no_more_than_the_room_there_is() {
    let (sock, pod) = pair();
    pod.send(&[7u8; 100]).unwrap();
    let mut buf = Vec::with_capacity(10);
    let mut limited = (&mut buf).limit(10);
    assert_eq!(sock.read_buf(&mut limited).unwrap(), 10, "the frame is cut short");
    assert_eq!(buf, [7u8; 10]);
}

/// Frames of a batch land one behind the other whatever their size: small ones
/// from their slots, one longer than a slot put together from slot and overflow.
#[test]
fn read_many_appends_a_batch_one_frame_behind_the_other() {
    let (sock, pod) = pair();
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    pod.send(b"one").unwrap();
    pod.send(&big).unwrap();
    pod.send(b"three").unwrap();
    pod.send(&[9u8; READ_SLOT]).unwrap();
    let mut room = ReadRoom::new();
    let mut buf = BytesMut::new();
    buf.extend_from_slice(b"kept");
    let mut lens = Vec::new();
    assert_eq!(sock.read_many(&mut buf, &mut room, READ_BATCH, &mut lens).unwrap(), 4);
    assert_eq!(lens, [3, big.len(), 5, READ_SLOT]);
    assert_eq!(&buf[..7], b"keptone");
    assert!(buf[7..7 + big.len()] == big[..], "the super-frame is whole");
    assert_eq!(&buf[7 + big.len()..12 + big.len()], b"three");
    assert!(buf[12 + big.len()..].iter().all(|b| *b == 9));
    assert_eq!(buf.len(), 4 + 3 + big.len() + 5 + READ_SLOT);
    let e = sock.read_many(&mut buf, &mut room, READ_BATCH, &mut lens).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    assert_eq!(lens.len(), 4, "a failed read adds nothing");
}

/// A batch takes no more than asked for (and than [`READ_BATCH`]); the rest waits.
#[test]
fn read_many_takes_at_most_max_frames() {
    let (sock, pod) = pair();
    for i in 0..READ_BATCH + 3 {
        pod.send(&[i as u8; 60]).unwrap();
    }
    let mut room = ReadRoom::new();
    let mut buf = BytesMut::new();
    let mut lens = Vec::new();
    assert_eq!(sock.read_many(&mut buf, &mut room, 1, &mut lens).unwrap(), 1);
    assert_eq!(
        sock.read_many(&mut buf, &mut room, 1000, &mut lens).unwrap(),
        READ_BATCH
    );
    assert_eq!(sock.read_many(&mut buf, &mut room, 1000, &mut lens).unwrap(), 2);
    assert_eq!(lens, vec![60; READ_BATCH + 3]);
    for (i, frame) in buf.chunks(60).enumerate() {
        assert!(frame.iter().all(|b| *b == i as u8), "frame {i} in its place");
    }
}

#[test]
fn writes_one_frame_per_call() {
    let (sock, pod) = pair();
    assert_eq!(sock.write(b"to the pod").unwrap(), 10);
    let mut got = [0u8; 32];
    assert_eq!(pod.recv(&mut got).unwrap(), 10);
    assert_eq!(&got[..10], b"to the pod");
    drop(pod);
    assert!(sock.write(b"gone").is_err(), "a write to a closed end fails");
}

/// End `id` lives in shard `id % count`; a shard is the prefix and a number only, so
/// one node's prefix never takes another node's shards (`lab-n1-e` and `lab-n10-e0`).
#[test]
fn ends_spread_by_the_count_and_shards_are_the_prefix_and_a_number() {
    let ends = NodeEnds::Shards {
        prefix: "lab-n1-e".into(),
        count: 64,
    };
    assert_eq!(ends.shard_of(5).as_deref(), Some("lab-n1-e5"));
    assert_eq!(ends.shard_of(64 + 17).as_deref(), Some("lab-n1-e17"));
    assert_eq!(NodeEnds::Here.shard_of(5), None);
    // A count of 0 (which weftd's flag refuses) would divide by zero: it counts as 1.
    let one = NodeEnds::Shards {
        prefix: "p".into(),
        count: 0,
    };
    assert_eq!(one.shard_of(12).as_deref(), Some("p0"));
    assert!(is_shard_of("lab-n1-e", "lab-n1-e0"));
    assert!(is_shard_of("lab-n1-e", "lab-n1-e63"));
    assert!(!is_shard_of("lab-n1-e", "lab-n10-e0"));
    assert!(!is_shard_of("lab-n1-e", "lab-n1-e"));
    assert!(!is_shard_of("lab-n1-e", "lab-n1-ex1"));
    assert!(!is_shard_of("lab-n1-e", "lab-n2-e0"));
}
