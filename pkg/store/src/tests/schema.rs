//! The schema: versioned, migrated from every older version, newer ones refused.

use super::*;

#[test]
fn state_survives_reopen_and_schema_is_versioned() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weft.db");
    let id = {
        let mut db = Db::open(&path).unwrap();
        assert_eq!(db.schema_found(), 0);
        created(db.begin_add(&spec("a", &["10.0.0.0/24"])).unwrap()).id
    };
    let mut db = Db::open(&path).unwrap();
    assert_eq!(db.schema_found(), SCHEMA_VERSION);
    let a = db.get(&spec("a", &[]).key).unwrap().unwrap();
    assert_eq!(a.id, id);
    assert_eq!(a.state, State::Creating);
    // The cursor persisted: the next address follows.
    let b = created(db.begin_add(&spec("b", &["10.0.0.0/24"])).unwrap());
    assert_eq!(b.addresses[0].address, "10.0.0.3".parse::<IpAddr>().unwrap());
}

#[test]
fn newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weft.db");
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
    }
    assert!(matches!(Db::open(&path), Err(StoreError::TooNew { .. })));
}

/// A database written by weft before schema 5 (no routes, no MAC column) is migrated,
/// and its attachments read as what weft installed then: the default route through
/// each gateway, the derived MAC.
#[test]
fn attachments_from_schema_4_read_as_what_they_installed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weft.db");
    {
        let mut c = rusqlite::Connection::open(&path).unwrap();
        crate::schema::migrate_to(&mut c, 4).unwrap();
        c.execute_batch(
            "INSERT INTO ranges (id, cidr) VALUES (1, '10.0.0.0/24'), (2, 'fd00::/64');
             INSERT INTO attachments (id, network, container_id, ifname, netns, host_ifname, mtu, state, result,
                                      created_at, updated_at)
                 VALUES (1, 'weft', 'old', 'eth0', '/run/netns/old', 'weftold', 1500, 'ready', '{}', 0, 0);
             INSERT INTO allocations (address, range_id, attachment_id) VALUES
                 (X'00000000000000000000ffff0a000002', 1, 1),
                 (X'fd000000000000000000000000000002', 2, 1);",
        )
        .unwrap();
    }
    let mut db = Db::open(&path).unwrap();
    assert_eq!(db.schema_found(), 4);
    let old = db.get(&spec("old", &[]).key).unwrap().unwrap();
    assert_eq!(old.addresses[0].address, ip("10.0.0.2"));
    assert_eq!(
        old.routes,
        vec![route("0.0.0.0/0", "10.0.0.1"), route("::/0", "fd00::1")]
    );
    assert_eq!(old.pod_mac, None);
    // And the migrated database takes new attachments as any other.
    let mut n = spec("new", &["10.0.0.0/24"]);
    n.requested = vec![ip("10.0.0.9")];
    let n = created(db.begin_add(&n).unwrap());
    db.finish_add(n.id, "{}", &[route("10.0.0.0/8", "10.0.0.1")]).unwrap();
    assert_eq!(db.get(&n.key).unwrap().unwrap().routes.len(), 1);
}

/// The schema objects of a database, whitespace folded so indentation does not count.
fn schema_of(c: &rusqlite::Connection) -> Vec<(String, String, String)> {
    let mut stmt = c
        .prepare("SELECT type, name, COALESCE(sql, '') FROM sqlite_master ORDER BY type, name")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, String>(2)?)))
        .unwrap()
        .map(|r| {
            let (t, n, sql) = r.unwrap();
            (t, n, sql.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .collect()
}

/// The fixtures the migration tests start from (`tests/fixtures/weft-schema-N.sql`)
/// hold exactly the schema that weft's migrations made at that version, so the tests
/// start from what a node really has on disk.
#[test]
fn migration_fixtures_match_the_schema_of_their_version() {
    let fixtures = [
        include_str!("../../tests/fixtures/weft-schema-1.sql"),
        include_str!("../../tests/fixtures/weft-schema-2.sql"),
        include_str!("../../tests/fixtures/weft-schema-3.sql"),
        include_str!("../../tests/fixtures/weft-schema-4.sql"),
    ];
    for (i, sql) in fixtures.iter().enumerate() {
        let version = i as u32 + 1;
        let fixture = rusqlite::Connection::open_in_memory().unwrap();
        fixture.execute_batch(sql).unwrap();
        let mut made = rusqlite::Connection::open_in_memory().unwrap();
        crate::schema::migrate_to(&mut made, version).unwrap();
        assert_eq!(schema_of(&fixture), schema_of(&made), "schema {version}");
        let v: u32 = fixture.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
        assert_eq!(v, version);
    }
}
