//! A weftd started while the previous one still holds the state directory (seconds
//! after a SIGKILL, a crash, or `weftctl lab crash` followed at once by `lab up`) waits
//! for it, bounded and with one log line, instead of failing at once.

use std::time::{Duration, Instant};

use weft_tests::{Daemon, bin, privileged, run, wait_exit};

fn serves(socket: &std::path::Path) -> bool {
    run(std::process::Command::new(bin("weftctl")).args(["--socket", socket.to_str().unwrap(), "--json", "status"]))
        .status
        .success()
}

#[test]
fn a_second_weftd_waits_for_the_state_lock_and_serves_once_it_is_free() {
    let _area = weft_tests::area("node::restart");
    if !privileged() {
        return;
    }
    let mut d = Daemon::start("relock");
    let mut second = d.spawn_second(true, Duration::from_secs(20));
    // It waits, and says so once.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d
        .log()
        .contains("another weftd holds the state directory; waiting for it to exit")
    {
        assert!(Instant::now() < deadline, "no waiting line:\n{}", d.log());
        assert!(
            second.try_wait().unwrap().is_none(),
            "the second weftd gave up at once:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(second.try_wait().unwrap().is_none(), "still waiting:\n{}", d.log());
    assert_eq!(
        d.log().matches("another weftd holds the state directory").count(),
        1,
        "one line, not one per try"
    );
    // The first one dies; the second takes over and serves.
    d.kill();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !serves(&d.second_socket()) {
        assert!(Instant::now() < deadline, "the second weftd never served:\n{}", d.log());
        assert!(
            second.try_wait().unwrap().is_none(),
            "the second weftd exited:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        d.log().contains("the previous weftd released the state directory"),
        "{}",
        d.log()
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(second.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    assert!(wait_exit(&mut second, Duration::from_secs(15)).is_some());
}

#[test]
fn the_wait_is_bounded() {
    let _area = weft_tests::area("node::restart");
    if !privileged() {
        return;
    }
    let d = Daemon::start("relock-bound");
    let started = Instant::now();
    let st = d.start_second(true);
    assert!(!st.success(), "a state directory in use is refused after the wait");
    assert!(started.elapsed() >= Duration::from_secs(1), "it waited its second");
    assert!(
        d.log().contains("another weftd is running on state directory"),
        "{}",
        d.log()
    );
}
