//! Topology files as a lab directory holds them: any bytes, read as YAML or as JSON,
//! load without panicking; what loads is valid and survives being written back as
//! YAML and read again.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use weft_topology::{parse_topologies, validate};

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let path = if first & 1 == 1 {
        Path::new("t.json")
    } else {
        Path::new("t.yaml")
    };
    let (topologies, _problems) = parse_topologies(path, rest);
    for t in &topologies {
        assert_eq!(validate(t), Ok(()));
    }
    if !topologies.is_empty() {
        let yaml: Vec<String> = topologies
            .iter()
            .map(|t| serde_yaml_ng::to_string(t).unwrap())
            .collect();
        let (back, problems) = parse_topologies(Path::new("again.yaml"), yaml.join("---\n").as_bytes());
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(back, topologies);
    }
});
