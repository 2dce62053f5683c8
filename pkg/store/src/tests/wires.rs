//! Wire rows: unique VNIs, kept across reopen, unknown states reported.

use super::*;

fn wire(id: u64, uid: i64, vni: Option<u32>) -> WireEnd {
    WireEnd {
        id,
        namespace: "lab".into(),
        link_uid: uid,
        local_pod: "r1".into(),
        local_intf: format!("eth{uid}"),
        peer_pod: "r2".into(),
        peer_intf: "eth1".into(),
        peer_id: id + 1000,
        kind: if vni.is_some() { LinkKind::Vxlan } else { LinkKind::Grpc },
        peer_node: "10.2.0.2".into(),
        vni,
        netns: "/run/netns/r1".into(),
        state: WireState::Up,
    }
}

#[test]
fn wires_are_kept_with_unique_vnis_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weft.db");
    {
        let mut db = Db::open(&path).unwrap();
        db.put_wire(&wire(1, 1, Some(5001))).unwrap();
        db.put_wire(&wire(2, 2, None)).unwrap();
        match db.put_wire(&wire(3, 3, Some(5001))) {
            Err(StoreError::VniTaken { vni: 5001, holder: 1 }) => {}
            other => panic!("expected VniTaken, got {other:?}"),
        }
        // Updating a wire keeps its own VNI.
        let mut w1 = wire(1, 1, Some(5001));
        w1.state = WireState::Down;
        db.put_wire(&w1).unwrap();
        assert_eq!(db.vni_holder(5001).unwrap(), Some(1));
    }
    let mut db = Db::open(&path).unwrap();
    let all = db.wires().unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].state, WireState::Down);
    assert_eq!(all[1], wire(2, 2, None), "a wire end reads back as it was put");
    assert_eq!(db.wire(2).unwrap().unwrap().peer_id, 1002);
    db.remove_wire(1).unwrap();
    assert_eq!(db.vni_holder(5001).unwrap(), None);
    db.put_wire(&wire(3, 3, Some(5001))).unwrap();
}

#[test]
fn a_wire_row_with_an_unknown_state_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weft.db");
    let mut db = Db::open(&path).unwrap();
    db.put_wire(&wire(1, 1, None)).unwrap();
    db.put_wire(&wire(2, 2, Some(5002))).unwrap();
    // The schema checks kinds but not states: a newer weftd may have written one.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute("UPDATE wires SET state = 'draining' WHERE id = 1", [])
        .unwrap();
    match db.wire(1) {
        Err(e @ StoreError::UnknownWireName { id: 1, .. }) => {
            assert_eq!(
                e.to_string(),
                "wire 0x1 in the state store: unknown wire state \"draining\""
            );
        }
        other => panic!("expected UnknownWireName, got {other:?}"),
    }
    assert!(matches!(db.wires(), Err(StoreError::UnknownWireName { id: 1, .. })));
    assert_eq!(db.wire(2).unwrap(), Some(wire(2, 2, Some(5002))));
}

/// The wires table checks kinds by name (`CHECK (kind IN ...)` in the schema): a kind
/// added to `LinkKind` fails here until a migration lets the store hold it.
#[test]
fn every_link_kind_can_be_stored() {
    let dir = tempfile::tempdir().unwrap();
    let mut db = Db::open(&dir.path().join("weft.db")).unwrap();
    for (i, &kind) in LinkKind::ALL.iter().enumerate() {
        let mut w = wire(i as u64 + 1, i as i64 + 1, None);
        w.kind = kind;
        db.put_wire(&w)
            .unwrap_or_else(|e| panic!("the store refuses {kind} ends ({e}): add a migration for the new kind"));
        assert_eq!(db.wire(w.id).unwrap().unwrap().kind, kind);
    }
}
