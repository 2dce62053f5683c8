//! Tests of `matrix`.

use std::net::{Ipv4Addr, TcpListener, UdpSocket};

use super::*;

fn table(pods: &[&str], rows: &[&str]) -> Table {
    Table {
        port: "80/tcp".parse().unwrap(),
        family: Family::V4,
        pods: pods.iter().map(|p| p.to_string()).collect(),
        cells: rows
            .iter()
            .map(|r| {
                r.chars()
                    .map(|c| match c {
                        '.' => Cell::Reachable,
                        'X' => Cell::Blocked,
                        _ => Cell::Error("refused".into()),
                    })
                    .collect()
            })
            .collect(),
    }
}

#[test]
fn ports_and_families_parse() {
    assert_eq!(
        "80/TCP".parse::<Port>().unwrap(),
        Port {
            number: 80,
            protocol: Protocol::Tcp
        }
    );
    assert_eq!("53/udp".parse::<Port>().unwrap().to_string(), "53/udp");
    assert_eq!("8080".parse::<Port>().unwrap().to_string(), "8080/tcp");
    for bad in ["0/tcp", "80/icmp", "x/tcp", "70000"] {
        assert!(bad.parse::<Port>().is_err(), "{bad}");
    }
    assert_eq!("6".parse::<Family>().unwrap(), Family::V6);
    assert_eq!("IPv4".parse::<Family>().unwrap(), Family::V4);
}

#[test]
fn printed_tables_read_back_and_compare() {
    let m = Matrix {
        tables: vec![table(&["x/a", "x/b", "default/c"], &["..X", "X..", "..?"])],
        elapsed: Duration::ZERO,
    };
    let text = m.to_text();
    assert_eq!(
        text,
        "80/tcp IPv4\n-         x/a       x/b       default/c\nx/a       .         .         X\nx/b       X         .         .\ndefault/c .         .         ?\n"
    );
    let read = parse_tables(&format!("# a comment\n\n{text}")).unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].title, "80/tcp IPv4");
    assert_eq!(read[0].rows, ["x/a", "x/b", "default/c"]);
    assert!(m.differences(&read).is_empty());
    assert_eq!(m.errors(), ["80/tcp IPv4 default/c -> default/c: refused"]);

    let other =
        parse_tables("80/tcp\n- x/a x/b default/c\nx/a . X X\nx/b X . .\ndefault/c . . ?\n81/udp IPv4\n- x/a\nx/a .\n")
            .unwrap();
    assert_eq!(
        m.differences(&other),
        [
            "80/tcp IPv4 x/a -> x/b: expected X, got .",
            "81/udp IPv4: expected, but not measured (no --port or family for it)"
        ]
    );
    let json = m.to_json();
    assert_eq!(json["tables"][0]["reachable"][0], json!([true, true, false]));
    assert_eq!(json["tables"][0]["reachable"][2][2], Value::Null);
    assert_eq!(json["tables"][0]["errors"][0]["to"], "default/c");
}

/// A port nothing on this machine listens on now, of `protocol`.
fn free_port(protocol: Protocol) -> u16 {
    match protocol {
        Protocol::Udp => UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port(),
        _ => TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port(),
    }
}

fn probe(to: SocketAddr, protocol: Protocol) -> Probe {
    Probe {
        at: (0, 0),
        to,
        protocol,
        source_port: 0,
        sockets: Vec::new(),
        last_send: Instant::now(),
        result: None,
    }
}

#[test]
fn listeners_answer_and_a_refusal_is_an_error_not_blocked() {
    let (tcp, udp) = (free_port(Protocol::Tcp), free_port(Protocol::Udp));
    let ports = [
        Port {
            number: tcp,
            protocol: Protocol::Tcp,
        },
        Port {
            number: udp,
            protocol: Protocol::Udp,
        },
    ];
    let listeners = open_listeners(&ports, &[Family::V4]).unwrap();
    let e = open_listeners(&ports[..1], &[Family::V4]).err().unwrap();
    assert!(e.contains("listens on it already"), "{e}");
    let stop = AtomicBool::new(false);
    let local = |port| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
    let mut probes = vec![
        probe(local(tcp), Protocol::Tcp),
        probe(local(udp), Protocol::Udp),
        probe(local(free_port(Protocol::Tcp)), Protocol::Tcp),
        probe(local(free_port(Protocol::Udp)), Protocol::Udp),
    ];
    let started = Instant::now();
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        s.spawn(|| serve(&listeners, &stop));
        run_probes(&mut probes, Duration::from_secs(2));
    });
    let results: Vec<Cell> = probes.into_iter().map(|p| p.result.unwrap()).collect();
    assert_eq!(results[..2], [Cell::Reachable, Cell::Reachable]);
    for r in &results[2..] {
        assert!(matches!(r, Cell::Error(e) if e.contains("nothing listens")), "{r:?}");
    }
    assert!(started.elapsed() < Duration::from_secs(1), "answers end the wait");
}

#[test]
fn bad_expectations_say_where() {
    for (text, want) in [
        ("- x/a\nx/a .\n", "line 1: a header line without a title"),
        ("80/tcp\nx/a .\n", "line 2: a row before"),
        ("80/tcp\n- x/a x/b\nx/a .\n", "line 3: 1 cells for 2 columns"),
        ("80/tcp\n- x/a\nx/a o\n", "line 3: cell \"o\""),
        (
            "80/tcp\n- x/a\nx/a .\n80/tcp IPv4\n",
            "line 4: table 80/tcp IPv4 given twice",
        ),
    ] {
        let e = parse_tables(text).unwrap_err();
        assert!(e.starts_with(want), "{text:?}: {e}");
    }
}
