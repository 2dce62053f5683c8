//! A lost state database: weftd stopped with three pods set up, its database then
//! overwritten with garbage (or deleted), and started again. It does not start blindly:
//! it moves a damaged file aside, rebuilds the attachments from the kernel (the host
//! ends' `weft:` aliases, their addresses and routes), logs and counts what it rebuilt,
//! and serves. The pods keep their addresses and their connectivity, a new pod gets none
//! of theirs, and their DELs leave nothing behind.

use std::path::Path;

use weft_tests::{Call, Daemon, Netns, privileged};

const V4: &str = "10.253.0.0/24";
const GATEWAY: &str = "10.253.0.1";

fn first_address(r: &serde_json::Value) -> String {
    r["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

/// The value of an unlabelled sample on the metrics page.
fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn rebuilds_after(tag: &str, lose: impl FnOnce(&Path), moved_aside: bool) {
    if !privileged() {
        return;
    }
    let mut d = Daemon::start(tag);
    let conf = d.conf("1.1.0", &[V4]);
    let pods: Vec<Netns> = (0..3).map(|i| Netns::new(&format!("{tag}-p{i}"))).collect();
    let cid = |i: usize| format!("ctr-{tag}-{i}");
    let mut addresses = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let r = Call::new("ADD", &cid(i), &pod.path(), &conf).run().ok();
        addresses.push(first_address(&r));
        assert!(pod.ping(GATEWAY), "pod {i} reaches its gateway before");
    }
    let before: Vec<_> = {
        let mut rows = d.store_attachments();
        rows.sort_by(|a, b| a.key.container_id.cmp(&b.key.container_id));
        rows
    };

    assert!(d.stop().is_some_and(|s| s.success()), "{}", d.log());
    let db = d.state_dir().join("weft.db");
    lose(&db);
    d.start_again();

    // It said what it did.
    let log = d.log();
    assert_eq!(
        log.matches("rebuilt an attachment from the kernel").count(),
        3,
        "one line per pod:\n{log}"
    );
    assert!(log.contains("state rebuilt from the kernel"), "{log}");
    let kept: Vec<_> = std::fs::read_dir(d.state_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("weft.db.corrupt-") && !name.ends_with("-wal") && !name.ends_with("-shm")
        })
        .collect();
    if moved_aside {
        assert!(log.contains("the state database is damaged; moved it aside"), "{log}");
        assert_eq!(kept.len(), 1, "the damaged file is kept for people: {kept:?}");
        assert_eq!(std::fs::read(&kept[0]).unwrap(), vec![0x5a_u8; 64 * 1024], "as it was");
    } else {
        assert!(kept.is_empty());
    }
    let page = d.http_get("/metrics", "text/plain");
    assert_eq!(sample(&page, "weft_store_rebuilds_total"), Some(1.0), "{page}");
    assert_eq!(
        sample(&page, "weft_store_rebuilt_attachments_total"),
        Some(3.0),
        "{page}"
    );

    // The pods keep their attachments and addresses.
    let mut after = d.store_attachments();
    after.sort_by(|a, b| a.key.container_id.cmp(&b.key.container_id));
    assert_eq!(after.len(), 3, "{after:?}");
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(a.key, b.key);
        assert_eq!(a.state, weft_store::State::Ready);
        assert_eq!(a.host_ifname, b.host_ifname);
        assert_eq!(a.netns, b.netns);
        assert_eq!(a.mtu, b.mtu);
        let addrs = |x: &weft_store::Attachment| x.addresses.iter().map(|a| (a.address, a.gateway)).collect::<Vec<_>>();
        assert_eq!(addrs(a), addrs(b));
        assert_eq!(a.routes, b.routes);
    }
    // Give the reconcile loop a pass over the rebuilt rows: it must find nothing to break.
    std::thread::sleep(std::time::Duration::from_secs(2));
    for (i, pod) in pods.iter().enumerate() {
        assert!(
            pod.ping(GATEWAY),
            "pod {i} reaches its gateway after the rebuild:\n{}",
            d.log()
        );
    }

    // A repeated ADD of a rebuilt pod is answered as its first one was.
    let again = Call::new("ADD", &cid(0), &pods[0].path(), &conf).run().ok();
    assert_eq!(first_address(&again), addresses[0], "{again}");
    assert_eq!(
        again["interfaces"][0]["name"],
        before[0].host_ifname.as_str(),
        "{again}"
    );

    // A new pod gets none of the old pods' addresses.
    let fresh = Netns::new(&format!("{tag}-new"));
    let r = Call::new("ADD", &cid(9), &fresh.path(), &conf).run().ok();
    let new_address = first_address(&r);
    assert!(
        !addresses.contains(&new_address),
        "{new_address} is an old pod's: {addresses:?}"
    );
    assert!(fresh.ping(GATEWAY));

    // Every DEL succeeds and leaves nothing.
    for (i, pod) in pods.iter().enumerate() {
        Call::new("DEL", &cid(i), &pod.path(), &conf).run().ok();
    }
    Call::new("DEL", &cid(9), &fresh.path(), &conf).run().ok();
    d.assert_clean();
    assert!(d.store_attachments().is_empty());
    for pod in &pods {
        assert_eq!(pod.links(), vec!["lo"]);
    }
}

#[test]
fn a_database_overwritten_with_garbage_is_moved_aside_and_rebuilt_from_the_kernel() {
    let _area = weft_tests::area("node::store_faults");
    rebuilds_after(
        "sf-garbage",
        |db| {
            // The write-ahead log too: with it intact, SQLite would read the pages it
            // holds from it and never see the damage.
            for suffix in ["", "-wal"] {
                std::fs::write(format!("{}{suffix}", db.display()), vec![0x5a_u8; 64 * 1024]).unwrap();
            }
        },
        true,
    );
}

#[test]
fn a_deleted_database_is_rebuilt_from_the_kernel() {
    let _area = weft_tests::area("node::store_faults");
    rebuilds_after(
        "sf-deleted",
        |db| {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
            }
        },
        false,
    );
}

/// The database as schema version 4 had it, made from this one's in place: what
/// versions 5 to 8 added goes (an attachment of version 4 had no recorded routes: the
/// default route through each gateway, which the pods of this test have). Version 4 is
/// the last with pods' rows in another shape, so the migration has rows to carry.
fn downgrade_to_schema_4(db: &Path) {
    let script = r#"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
c.executescript("""
DROP TRIGGER attachments_insert_bumps;
DROP TRIGGER attachments_update_bumps;
DROP TRIGGER attachments_delete_bumps;
DROP TRIGGER allocations_insert_bumps;
DROP TRIGGER allocations_update_bumps;
DROP TRIGGER allocations_delete_bumps;
DROP TRIGGER ranges_insert_bumps;
DROP TRIGGER ranges_update_bumps;
DROP TRIGGER ranges_delete_bumps;
DROP TABLE pods_version;
DROP TABLE sysctls;
DROP TABLE port_shares;
DROP TABLE link_settings;
DROP INDEX attachments_by_container;
ALTER TABLE attachments DROP COLUMN routes;
ALTER TABLE attachments DROP COLUMN pod_mac;
PRAGMA user_version = 4;
""")
c.commit()
assert c.execute("PRAGMA user_version").fetchone()[0] == 4
c.close()
"#;
    weft_tests::sh(std::process::Command::new("python3").args(["-c", script]).arg(db));
}

#[test]
fn a_database_of_an_older_schema_is_migrated_in_place_and_the_pods_keep_their_network() {
    let _area = weft_tests::area("node::store_faults");
    if !privileged() {
        return;
    }
    let tag = "sf-migrate";
    let mut d = Daemon::start(tag);
    let conf = d.conf("1.1.0", &[V4]);
    let pods: Vec<Netns> = (0..2).map(|i| Netns::new(&format!("{tag}-p{i}"))).collect();
    let cid = |i: usize| format!("ctr-{tag}-{i}");
    let mut addresses = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let r = Call::new("ADD", &cid(i), &pod.path(), &conf).run().ok();
        addresses.push(first_address(&r));
        assert!(pod.ping(GATEWAY), "pod {i} reaches its gateway before");
    }
    assert!(d.stop().is_some_and(|s| s.success()), "{}", d.log());
    downgrade_to_schema_4(&d.state_dir().join("weft.db"));
    d.start_again();

    let log = d.log();
    assert!(
        log.contains("migrated in place from an older weft's schema"),
        "the migration is logged:\n{log}"
    );
    assert!(
        !log.contains("rebuilt an attachment from the kernel"),
        "nothing was rebuilt:\n{log}"
    );
    let page = d.http_get("/metrics", "text/plain");
    assert_eq!(sample(&page, "weft_store_rebuilds_total"), Some(0.0), "{page}");
    let rows = d.store_attachments();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (i, pod) in pods.iter().enumerate() {
        assert!(
            pod.ping(GATEWAY),
            "pod {i} reaches its gateway after the migration:\n{}",
            d.log()
        );
        // A repeated ADD is answered from the migrated row, with the same address.
        let again = Call::new("ADD", &cid(i), &pod.path(), &conf).run().ok();
        assert_eq!(first_address(&again), addresses[i], "{again}");
    }
    // The migrated rows tear down as new ones do.
    for (i, pod) in pods.iter().enumerate() {
        Call::new("DEL", &cid(i), &pod.path(), &conf).run().ok();
        assert_eq!(pod.links(), vec!["lo"]);
    }
    d.assert_clean();
    assert!(d.store_attachments().is_empty());
}
