//! `CNI_ARGS` as the plugin reads it from its environment: any string parses or is
//! refused with code 4, and what parses is exactly the input's `KEY=VALUE` pairs.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_cni::{code, parse_cni_args};

fuzz_target!(|data: &[u8]| {
    // The environment may hold any bytes; the plugin sees them as a (lossy) string.
    let raw = String::from_utf8_lossy(data);
    match parse_cni_args(&raw) {
        Ok(m) => {
            let pairs: Vec<&str> = raw.split(';').filter(|p| !p.is_empty()).collect();
            assert!(m.len() <= pairs.len());
            for (k, v) in &m {
                assert!(!k.is_empty() && !k.contains('=') && !k.contains(';'));
                assert!(!v.contains(';'));
                assert!(pairs.contains(&format!("{k}={v}").as_str()));
            }
            // Rendering the map again gives a string that parses to the same map.
            let again: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
            assert_eq!(parse_cni_args(&again.join(";")).unwrap(), m);
        }
        Err(e) => {
            assert_eq!(e.code, code::INVALID_ENV);
            assert!(e.details.starts_with("CNI_ARGS: "));
        }
    }
});
