//! Process limits a node daemon outgrows at scale.

/// Raises the soft limit on open files to the hard limit, and returns the new soft
/// limit. Every gRPC wire end holds a packet socket for as long as the link lives, so
/// a node with a thousand gRPC link ends (a 1,500-link lab on three nodes) needs more
/// descriptors than the soft limit of 1,024 most service managers and shells start
/// processes with; the hard limit is what the administrator allows. weftd's `main`
/// calls it once.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed to them.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        let soft = super::raise_open_files_limit().unwrap();
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
        let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
        let hard = line.split_whitespace().nth(4).unwrap();
        assert_eq!(hard.parse::<u64>().ok().unwrap_or(u64::MAX), soft);
    }
}
