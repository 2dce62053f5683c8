//! The schema of the state database and its migrations, tracked in `PRAGMA user_version`.
//!
//! Migrations are plain SQL applied in order inside one transaction each; a database
//! from a newer weft (a higher version than this binary knows) is refused rather than
//! guessed at. Hand-rolled because the migration crates pin an older rusqlite.

use rusqlite::Connection;

use crate::StoreError;

/// Migration `i` brings the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 1: ranges, attachments, allocations.
    r"
    CREATE TABLE ranges (
        id      INTEGER PRIMARY KEY,
        cidr    TEXT NOT NULL UNIQUE,
        -- the last address handed out from this range (16 bytes), so the next
        -- allocation continues after it instead of reusing a just-freed address
        cursor  BLOB
    );
    CREATE TABLE attachments (
        id            INTEGER PRIMARY KEY,
        network       TEXT NOT NULL,
        container_id  TEXT NOT NULL,
        ifname        TEXT NOT NULL,
        netns         TEXT NOT NULL,
        pod_namespace TEXT NOT NULL DEFAULT '',
        pod_name      TEXT NOT NULL DEFAULT '',
        pod_uid       TEXT NOT NULL DEFAULT '',
        host_ifname   TEXT NOT NULL UNIQUE,
        mtu           INTEGER NOT NULL,
        -- creating: intent recorded, kernel work in progress (or interrupted)
        -- ready:    fully set up; result holds the ADD result
        -- deleting: DEL accepted, teardown in progress (or interrupted)
        state         TEXT NOT NULL CHECK (state IN ('creating', 'ready', 'deleting')),
        result        TEXT,
        created_at    INTEGER NOT NULL,
        updated_at    INTEGER NOT NULL,
        UNIQUE (network, container_id, ifname)
    );
    CREATE TABLE allocations (
        -- 16 bytes big-endian; IPv4 stored IPv4-mapped so all addresses order alike
        address       BLOB PRIMARY KEY,
        range_id      INTEGER NOT NULL REFERENCES ranges(id),
        attachment_id INTEGER NOT NULL REFERENCES attachments(id) ON DELETE CASCADE
    ) WITHOUT ROWID;
    CREATE INDEX allocations_by_range ON allocations(range_id);
    CREATE INDEX allocations_by_attachment ON allocations(attachment_id);
    CREATE INDEX attachments_by_state ON attachments(state);
    ",
    // 2: host ports.
    r"
    CREATE TABLE port_mappings (
        id             INTEGER PRIMARY KEY,
        attachment_id  INTEGER NOT NULL REFERENCES attachments(id) ON DELETE CASCADE,
        family         INTEGER NOT NULL CHECK (family IN (4, 6)),
        -- '' binds every address of the family
        host_ip        TEXT NOT NULL,
        host_port      INTEGER NOT NULL CHECK (host_port BETWEEN 1 AND 65535),
        protocol       TEXT NOT NULL CHECK (protocol IN ('tcp', 'udp', 'sctp')),
        container_ip   TEXT NOT NULL,
        container_port INTEGER NOT NULL CHECK (container_port BETWEEN 1 AND 65535),
        UNIQUE (family, host_ip, host_port, protocol)
    );
    CREATE INDEX port_mappings_by_port ON port_mappings(family, host_port, protocol);
    CREATE INDEX port_mappings_by_attachment ON port_mappings(attachment_id);
    ",
    // 3: wire ends.
    r"
    CREATE TABLE wires (
        -- this end's wire id: derived from (namespace, link uid, pod), stable forever
        id          INTEGER PRIMARY KEY,
        namespace   TEXT NOT NULL,
        link_uid    INTEGER NOT NULL,
        local_pod   TEXT NOT NULL,
        local_intf  TEXT NOT NULL,
        peer_pod    TEXT NOT NULL,
        peer_intf   TEXT NOT NULL,
        peer_id     INTEGER NOT NULL,
        kind        TEXT NOT NULL CHECK (kind IN ('veth', 'vxlan', 'grpc')),
        -- the peer's node address; '' when the peer is on this node or not known yet
        peer_node   TEXT NOT NULL DEFAULT '',
        -- VXLAN network id agreed with the peer node; unique on the node
        vni         INTEGER UNIQUE,
        -- the local pod's network namespace, to find the end again after a restart
        netns       TEXT NOT NULL,
        -- up | down | pending
        state       TEXT NOT NULL,
        updated_at  INTEGER NOT NULL,
        UNIQUE (namespace, link_uid, local_pod)
    );
    CREATE INDEX wires_by_pod ON wires(namespace, local_pod);
    CREATE INDEX attachments_by_pod ON attachments(pod_namespace, pod_name);
    ",
    // 4: daemon runs, so a start tells a first start from a restart after a clean stop
    // or a crash.
    r"
    CREATE TABLE daemon_runs (
        id          INTEGER PRIMARY KEY,
        version     TEXT NOT NULL,
        started_at  INTEGER NOT NULL,
        -- NULL while running, or when the run ended without stopping cleanly
        stopped_at  INTEGER
    );
    ",
    // 5: what an attachment installed, so a pod can have several networks (each
    // installs its own routes) and the runtime may pick the pod's MAC.
    r"
    -- 'dst via gw' entries separated by ','; '' installs none. NULL: the attachment
    -- was made before version 5, when every attachment had the default route through
    -- each of its gateways.
    ALTER TABLE attachments ADD COLUMN routes TEXT;
    -- the pod interface's MAC when the runtime asked for one; NULL: derived from the key
    ALTER TABLE attachments ADD COLUMN pod_mac TEXT;
    CREATE INDEX attachments_by_container ON attachments(container_id);
    ",
    // 6: link emulation set at run time (`weftctl link`), per wire end, kept apart from
    // the wire ends so it outlives an end rebuilt under the same wire id.
    r"
    CREATE TABLE link_settings (
        -- the wire end's id (wires.id; no foreign key: a setting may precede or
        -- outlive the end's row while the end is rebuilt)
        id          INTEGER PRIMARY KEY,
        -- 'param=value' pairs separated by ','; '' sets no impairment; NULL leaves
        -- the topology's
        impairment  TEXT,
        -- NULL: up; 'named': an operator took this end's link down; 'peer': the
        -- other end's
        down        TEXT CHECK (down IN ('named', 'peer')),
        updated_at  INTEGER NOT NULL
    );
    ",
    // 7: host ports one container asks for on several of its networks (a runtime sends
    // a container's `portMappings` to each network), and the kernel settings weftd
    // changed, with the value it found, so it can put them back.
    r"
    CREATE TABLE port_shares (
        id             INTEGER PRIMARY KEY,
        -- an attachment that asked for a mapping another attachment of the same
        -- container holds (port_mappings); it takes the mapping over when that one goes
        attachment_id  INTEGER NOT NULL REFERENCES attachments(id) ON DELETE CASCADE,
        family         INTEGER NOT NULL CHECK (family IN (4, 6)),
        host_ip        TEXT NOT NULL,
        host_port      INTEGER NOT NULL CHECK (host_port BETWEEN 1 AND 65535),
        protocol       TEXT NOT NULL CHECK (protocol IN ('tcp', 'udp', 'sctp')),
        container_ip   TEXT NOT NULL,
        container_port INTEGER NOT NULL CHECK (container_port BETWEEN 1 AND 65535),
        UNIQUE (attachment_id, family, host_ip, host_port, protocol)
    );
    CREATE INDEX port_shares_by_port ON port_shares(family, host_ip, host_port, protocol);
    CREATE TABLE sysctls (
        -- the sysctl's path under /proc/sys, as net/ipv4/conf/all/route_localnet
        name        TEXT PRIMARY KEY,
        -- the value found before weftd first changed it
        original    TEXT NOT NULL,
        changed_at  INTEGER NOT NULL
    );
    ",
    // 8: a version of what a listing of the node's pods reads (attachments, their
    // allocations, ranges), bumped by triggers at every row written there by any
    // statement, so the listing is read again only when it may have changed (the
    // policy engine asks at every pod another node announces).
    "
    CREATE TABLE pods_version (
        id  INTEGER PRIMARY KEY CHECK (id = 1),
        v   INTEGER NOT NULL
    );
    INSERT INTO pods_version (id, v) VALUES (1, 0);
    CREATE TRIGGER attachments_insert_bumps AFTER INSERT ON attachments BEGIN UPDATE pods_version SET v = v + 1; END;
    CREATE TRIGGER attachments_update_bumps AFTER UPDATE ON attachments BEGIN UPDATE pods_version SET v = v + 1; END;
    CREATE TRIGGER attachments_delete_bumps AFTER DELETE ON attachments BEGIN UPDATE pods_version SET v = v + 1; END;
    CREATE TRIGGER allocations_insert_bumps AFTER INSERT ON allocations BEGIN UPDATE pods_version SET v = v + 1; END;
    CREATE TRIGGER allocations_update_bumps AFTER UPDATE ON allocations BEGIN UPDATE pods_version SET v = v + 1; END;
    CREATE TRIGGER allocations_delete_bumps AFTER DELETE ON allocations BEGIN UPDATE pods_version SET v = v + 1; END;
    CREATE TRIGGER ranges_insert_bumps AFTER INSERT ON ranges BEGIN UPDATE pods_version SET v = v + 1; END;
    CREATE TRIGGER ranges_update_bumps AFTER UPDATE OF cidr ON ranges BEGIN UPDATE pods_version SET v = v + 1; END;
    CREATE TRIGGER ranges_delete_bumps AFTER DELETE ON ranges BEGIN UPDATE pods_version SET v = v + 1; END;
    ",
];

/// The schema version this binary writes.
pub const CURRENT_VERSION: u32 = MIGRATIONS.len() as u32;

/// Brings the database up to [`CURRENT_VERSION`], returning the version found.
pub fn migrate(conn: &mut Connection) -> Result<u32, StoreError> {
    migrate_to(conn, CURRENT_VERSION)
}

/// Brings the database up to `target` (tests make databases as older weft wrote them).
pub(crate) fn migrate_to(conn: &mut Connection, target: u32) -> Result<u32, StoreError> {
    let found: u32 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if found > CURRENT_VERSION {
        return Err(StoreError::TooNew {
            found,
            known: CURRENT_VERSION,
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().take(target as usize).skip(found as usize) {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", i as u32 + 1)?;
        tx.commit()?;
    }
    Ok(found)
}
