//! Faults: a panicking job, a full disk, a writer that went away.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_job_fails_its_call_and_the_store_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("weft.db")).unwrap();
    // A job that panics half-way through a transaction it opened by hand.
    let r: Result<(), StoreError> = store
        .run(|db| {
            db.execute_raw("BEGIN IMMEDIATE; INSERT INTO ranges (cidr) VALUES ('10.99.0.0/24');")?;
            panic!("a bug in a store job")
        })
        .await;
    match r {
        Err(StoreError::Panicked(m)) => assert!(m.contains("a bug in a store job"), "{m}"),
        other => panic!("expected Panicked, got {other:?}"),
    }
    // The next calls are served, and the half-done transaction was rolled back.
    let att = store
        .run(|db| db.begin_add(&spec("c1", &["10.244.1.0/24"])))
        .await
        .unwrap();
    assert!(matches!(att, BeginAdd::Created(_)));
    let ranges: Vec<String> = store
        .run(|db| Ok(db.range_usage()?.into_iter().map(|u| u.range.to_string()).collect()))
        .await
        .unwrap();
    assert_eq!(
        ranges,
        vec!["10.244.1.0/24".to_string()],
        "the panicked job's insert is gone"
    );
    // The blocking entry point too.
    let r: Result<(), StoreError> = store.run_blocking(|_| panic!("again"));
    assert!(matches!(r, Err(StoreError::Panicked(_))));
    assert!(store.run_blocking(|db| db.counts()).is_ok());
}

/// Caps the database at the pages it has now, as a full disk would: SQLite refuses to
/// grow it with `SQLITE_FULL`, whoever runs the test (root ignores file modes).
fn cap_pages(store: &Store, pages: Option<u32>) {
    let sql = format!("PRAGMA max_page_count = {}", pages.unwrap_or(1));
    store.run_blocking(move |db| db.execute_raw(&sql)).unwrap();
}

#[test]
fn a_store_that_cannot_write_is_unwritable_until_a_write_goes_through() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("weft.db")).unwrap();
    let mut watch = store.writable_watch();
    store.run_blocking(|db| db.begin_run("test")).unwrap();
    assert!(store.writable());
    // A job failing for a reason of its own says nothing about the database.
    let mut taken = spec("ip-taken", &["10.0.0.0/24"]);
    taken.requested = vec![ip("10.0.0.1")];
    assert!(matches!(
        store.run_blocking(move |db| db.begin_add(&taken)),
        Err(StoreError::AddressInvalid(_))
    ));
    assert!(store.writable());

    cap_pages(&store, None);
    let mut failure = None;
    for i in 0..2000 {
        let mut s = spec(&format!("c{i}"), &["10.0.0.0/16"]);
        s.pod.name = "p".repeat(2000);
        if let Err(e) = store.run_blocking(move |db| db.begin_add(&s)) {
            failure = Some(e);
            break;
        }
    }
    match failure {
        Some(StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, _))) => {
            assert_eq!(e.code, rusqlite::ErrorCode::DiskFull)
        }
        other => panic!("expected the capped database to fill up, got {other:?}"),
    }
    assert!(!store.writable(), "a full database is not writable");
    assert!(watch.has_changed().unwrap() && !*watch.borrow_and_update());
    // Reads still work, and do not make it writable.
    assert!(store.run_blocking(|db| db.counts()).is_ok());
    assert!(!store.writable());

    // Room again: the store stays unwritable until a write goes through; on an idle
    // node that write is the probe the daemon sends while the store is unwritable.
    cap_pages(&store, Some(1_000_000));
    assert!(!store.writable());
    store.run_blocking(|db| db.probe_write()).unwrap();
    assert!(store.writable(), "the probe's write went through");
    assert!(watch.has_changed().unwrap() && *watch.borrow_and_update());
    store
        .run_blocking(|db| db.begin_add(&spec("after", &["10.0.0.0/16"])))
        .unwrap();
    assert!(store.writable());
}

#[test]
fn a_store_that_went_down_is_unwritable() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let die = Arc::new(AtomicBool::new(false));
    let observer: Observer = {
        let die = die.clone();
        Arc::new(move |_| assert!(!die.load(Ordering::SeqCst), "the store goes down (test)"))
    };
    let store = Store::open_observed(&dir.path().join("weft.db"), Some(observer)).unwrap();
    assert!(store.writable());
    die.store(true, Ordering::SeqCst);
    // The job runs, then its observer takes the store down.
    let _ = store.run_blocking(|db| db.counts());
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.writable() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!store.writable(), "a store that went down is not writable");
    assert!(matches!(store.run_blocking(|db| db.counts()), Err(StoreError::Closed)));
}

#[test]
fn the_log_is_checkpointed_off_the_writers_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let store = Store::open(&path).unwrap();
    // The writer checkpoints by itself only far beyond what these jobs write.
    for i in 0..60 {
        store
            .run_blocking(move |db| db.begin_add(&spec(&format!("c{i}"), &["10.0.0.0/24"])).map(|_| ()))
            .unwrap();
    }
    // Once the checkpointer has copied the log, the next job starts it over; without
    // it, the log would hold every job's pages (some ten frames a job).
    std::thread::sleep(checkpoint::PERIOD * 4);
    store
        .run_blocking(|db| db.begin_add(&spec("last", &["10.0.0.0/24"])).map(|_| ()))
        .unwrap();
    let reader = rusqlite::Connection::open(&path).unwrap();
    let (frames, _) = checkpoint::checkpoint(&reader).unwrap();
    assert!(
        frames < 60,
        "the log was not checkpointed: {frames} frames after 61 jobs"
    );
    drop(store);
}
