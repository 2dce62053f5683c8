//! Tests of `conf`.

use super::*;

fn conf(extra: &str) -> Vec<u8> {
    format!(r#"{{"cniVersion":"1.1.0","name":"weft","type":"weft"{extra}}}"#).into_bytes()
}

#[test]
fn dual_stack_config_parses() {
    let c = NetworkConfig::parse(
        &conf(r#","ranges":["10.244.1.0/24","fd00:10:244:1::/64"],"mtu":1400"#),
        Cmd::Add,
    )
    .unwrap();
    assert_eq!(c.name, "weft");
    assert_eq!(c.ranges.len(), 2);
    assert_eq!(c.mtu, Some(1400));
    assert!(c.routes.is_empty() && c.default_route.is_none() && c.ips.is_empty() && c.mac.is_none());
}

#[test]
fn ranges_and_mtu_may_be_left_to_the_node() {
    for cmd in [Cmd::Add, Cmd::Status, Cmd::Del] {
        for none in ["", r#","ranges":[]"#, r#","ranges":null"#] {
            let c = NetworkConfig::parse(&conf(none), cmd).unwrap();
            assert!(c.ranges.is_empty(), "{none}");
            assert_eq!(c.mtu, None);
        }
    }
    // Without ranges, the IPv6 floor is the daemon's to check against the node's.
    assert_eq!(
        NetworkConfig::parse(&conf(r#","mtu":1000"#), Cmd::Add).unwrap().mtu,
        Some(1000)
    );
    assert!(NetworkConfig::parse(&conf(r#","mtu":67"#), Cmd::Add).is_err());
    assert_eq!(min_mtu(&["10.0.0.0/24".parse().unwrap()]), 68);
    assert_eq!(
        min_mtu(&["10.0.0.0/24".parse().unwrap(), "fd00::/64".parse().unwrap()]),
        1280
    );
}

#[test]
fn routes_and_default_route_parse() {
    let c = NetworkConfig::parse(
        &conf(r#","routes":[{"dst":"10.0.0.0/8"},{"dst":"::/0","gw":"fd00::1"}],"defaultRoute":true"#),
        Cmd::Add,
    )
    .unwrap();
    assert_eq!(
        c.routes,
        vec![
            RouteConf {
                dst: "10.0.0.0/8".parse().unwrap(),
                gw: None
            },
            RouteConf {
                dst: "::/0".parse().unwrap(),
                gw: Some("fd00::1".parse().unwrap())
            },
        ]
    );
    assert_eq!(c.default_route, Some(true));
    let c = NetworkConfig::parse(&conf(r#","defaultRoute":false"#), Cmd::Add).unwrap();
    assert_eq!(c.default_route, Some(false));
}

#[test]
fn bad_routes_are_code_7_for_add_only() {
    for bad in [
        r#","routes":{"dst":"10.0.0.0/8"}"#,
        r#","routes":["10.0.0.0/8"]"#,
        r#","routes":[{"gw":"10.0.0.1"}]"#,
        r#","routes":[{"dst":"10.0.0.1/8"}]"#,
        r#","routes":[{"dst":"nonsense"}]"#,
        r#","routes":[{"dst":"10.0.0.0/8","gw":"fd00::1"}]"#,
        r#","routes":[{"dst":"10.0.0.0/8","gw":"x"}]"#,
        r#","routes":[{"dst":"10.0.0.0/8","table":100}]"#,
        r#","routes":[{"dst":"10.0.0.0/8"},{"dst":"10.0.0.0/8"}]"#,
        r#","defaultRoute":"yes""#,
        r#","defaultRoute":false,"routes":[{"dst":"0.0.0.0/0"}]"#,
    ] {
        let e = NetworkConfig::parse(&conf(bad), Cmd::Add).unwrap_err();
        assert_eq!(e.code, Code::InvalidConfig, "{bad}: {e}");
        assert!(NetworkConfig::parse(&conf(bad), Cmd::Del).is_ok(), "{bad}");
        assert!(NetworkConfig::parse(&conf(bad), Cmd::Check).is_ok(), "{bad}");
    }
    let e = NetworkConfig::parse(&conf(r#","routes":[{"dst":"10.0.0.0/8","table":100}]"#), Cmd::Add).unwrap_err();
    assert!(e.details.contains("`table`"), "{}", e.details);
}

#[test]
fn runtime_config_ips_and_mac_parse() {
    let c = NetworkConfig::parse(
        &conf(r#","runtimeConfig":{"ips":["fd00::7/64","10.244.1.7/24"],"mac":"0a:58:0a:f4:01:07"}"#),
        Cmd::Add,
    )
    .unwrap();
    assert_eq!(
        c.ips,
        vec!["10.244.1.7".parse::<IpAddr>().unwrap(), "fd00::7".parse().unwrap()]
    );
    assert_eq!(c.mac, Some([0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x07]));
}

#[test]
fn plugin_view_defaults_the_socket() {
    let p = PluginConfig::parse(&conf(r#","ranges":["10.0.0.0/24"]"#), Cmd::Add).unwrap();
    assert_eq!(p.socket, DEFAULT_SOCKET);
    let p = PluginConfig::parse(&conf(r#","socket":"/tmp/x.sock""#), Cmd::Add).unwrap();
    assert_eq!(p.socket, "/tmp/x.sock");
}

#[test]
fn malformed_json_is_code_6() {
    assert_eq!(
        NetworkConfig::parse(b"{not json", Cmd::Add).unwrap_err().code,
        Code::Decode
    );
    assert_eq!(NetworkConfig::parse(b"", Cmd::Add).unwrap_err().code, Code::Decode);
    // `type` is required by the spec.
    assert_eq!(
        NetworkConfig::parse(br#"{"cniVersion":"1.1.0","name":"x"}"#, Cmd::Add)
            .unwrap_err()
            .code,
        Code::Decode
    );
}

#[test]
fn invalid_ranges_are_code_7_for_add_but_not_del() {
    for bad in [
        r#","ranges":["10.0.0.1/24"]"#,
        r#","ranges":["10.0.0.0/31"]"#,
        r#","ranges":["nonsense"]"#,
        r#","ranges":"10.0.0.0/24""#,
        r#","ranges":["10.0.0.0/16","10.0.1.0/24"]"#,
        r#","ranges":["fd00::/64","fd00::/48"]"#,
    ] {
        let e = NetworkConfig::parse(&conf(bad), Cmd::Add).unwrap_err();
        assert_eq!(e.code, Code::InvalidConfig, "{bad}: {e}");
        assert!(NetworkConfig::parse(&conf(bad), Cmd::Del).is_ok(), "{bad}");
    }
}

#[test]
fn host_bits_error_suggests_the_network() {
    let e = NetworkConfig::parse(&conf(r#","ranges":["10.0.0.1/24"]"#), Cmd::Add).unwrap_err();
    assert!(e.details.contains("10.0.0.0/24"), "{}", e.details);
}

#[test]
fn mtu_bounds() {
    assert!(NetworkConfig::parse(&conf(r#","ranges":["10.0.0.0/24"],"mtu":0"#), Cmd::Add).is_err());
    assert!(NetworkConfig::parse(&conf(r#","ranges":["fd00::/64"],"mtu":1000"#), Cmd::Add).is_err());
    assert!(NetworkConfig::parse(&conf(r#","ranges":["10.0.0.0/24"],"mtu":"9000""#), Cmd::Add).is_err());
}

#[test]
fn wait_for_links_is_a_bounded_duration_read_for_add_only() {
    let c = NetworkConfig::parse(&conf(r#","ranges":["10.0.0.0/24"],"waitForLinks":"3s""#), Cmd::Add).unwrap();
    assert_eq!(c.wait_for_links, Some(std::time::Duration::from_secs(3)));
    let none = NetworkConfig::parse(&conf(r#","ranges":["10.0.0.0/24"]"#), Cmd::Add).unwrap();
    assert_eq!(none.wait_for_links, None);
    for bad in [
        r#","waitForLinks":30"#,
        r#","waitForLinks":"later""#,
        r#","waitForLinks":"1h""#,
    ] {
        let e = NetworkConfig::parse(&conf(&format!(r#","ranges":["10.0.0.0/24"]{bad}"#)), Cmd::Add).unwrap_err();
        assert_eq!(e.code, Code::InvalidConfig, "{bad}");
        assert!(e.details.contains("waitForLinks"), "{bad}: {}", e.details);
        assert!(NetworkConfig::parse(&conf(&format!(r#","ranges":["10.0.0.0/24"]{bad}"#)), Cmd::Del).is_ok());
    }
}

#[test]
fn ipam_section_is_unsupported() {
    let e = NetworkConfig::parse(
        &conf(r#","ranges":["10.0.0.0/24"],"ipam":{"type":"host-local"}"#),
        Cmd::Add,
    )
    .unwrap_err();
    assert_eq!(e.code, Code::UnsupportedField);
}

#[test]
fn bad_network_name_is_code_7() {
    let e = NetworkConfig::parse(
        br#"{"cniVersion":"1.1.0","name":"bad name","type":"weft","ranges":["10.0.0.0/24"]}"#,
        Cmd::Add,
    )
    .unwrap_err();
    assert_eq!(e.code, Code::InvalidConfig);
}

#[test]
fn oversized_config_is_code_7() {
    let big = vec![b' '; MAX_CONFIG_BYTES + 1];
    assert_eq!(decode(&big).unwrap_err().code, Code::InvalidConfig);
}

#[test]
fn port_mappings_accept_both_spellings() {
    let c = NetworkConfig::parse(
        &conf(
            r#","ranges":["10.0.0.0/24"],"runtimeConfig":{"portMappings":[
            {"hostPort":8080,"containerPort":80,"protocol":"tcp"},
            {"HostPort":53,"ContainerPort":5353,"Protocol":"UDP","HostIP":"10.1.1.1"},
            {"hostPort":443,"containerPort":8443,"hostIP":"0.0.0.0"},
            {"hostPort":444,"containerPort":8443,"hostIP":"::"}]}"#,
        ),
        Cmd::Add,
    )
    .unwrap();
    let m = &c.port_mappings;
    assert_eq!(m.len(), 4);
    assert_eq!(
        (
            m[0].host_port,
            m[0].container_port,
            m[0].protocol.as_str(),
            m[0].host_ip
        ),
        (8080, 80, "tcp", HostIp::Any)
    );
    assert_eq!(
        (m[1].protocol.as_str(), m[1].host_ip),
        ("udp", HostIp::Addr("10.1.1.1".parse().unwrap()))
    );
    assert_eq!(m[2].host_ip, HostIp::AnyV4);
    assert_eq!(m[3].host_ip, HostIp::AnyV6);
}

#[test]
fn bad_port_mappings_are_code_7() {
    for bad in [
        r#"[{"hostPort":0,"containerPort":80}]"#,
        r#"[{"hostPort":70000,"containerPort":80}]"#,
        r#"[{"containerPort":80}]"#,
        r#"[{"hostPort":80,"containerPort":80,"protocol":"icmp"}]"#,
        r#"[{"hostPort":80,"containerPort":80,"hostIP":"nope"}]"#,
        r#"{"hostPort":80}"#,
    ] {
        let c = conf(&format!(
            r#","ranges":["10.0.0.0/24"],"runtimeConfig":{{"portMappings":{bad}}}"#
        ));
        assert_eq!(
            NetworkConfig::parse(&c, Cmd::Add).unwrap_err().code,
            Code::InvalidConfig,
            "{bad}"
        );
        assert!(
            NetworkConfig::parse(&c, Cmd::Del).is_ok(),
            "DEL ignores mappings: {bad}"
        );
    }
}

#[test]
fn declared_version_is_lenient() {
    assert_eq!(declared_version(br#"{"cniVersion":"0.4.0","x":"#), "1.1.0");
    assert_eq!(declared_version(br#"{"cniVersion":"0.4.0"}"#), "0.4.0");
    assert_eq!(declared_version(br#"{"cniVersion":"7.0.0"}"#), "7.0.0");
    assert_eq!(declared_version(br#"{"name":"x"}"#), "1.1.0");
}

/// Found by the `cni_config` fuzz target: with `cniVersion` given twice, errors were
/// reported under 1.1.0 (the typed reader refused the duplicate) while the config was
/// handled as the last one given.
#[test]
fn a_repeated_cni_version_is_read_as_the_config_is() {
    let bytes = br#"{"name":"weft","type":"weft","ranges":["10.0.0.0/24"],"cniVersion":"1","cniVersion":"1.0.0"}"#;
    let c = NetworkConfig::parse(bytes, Cmd::Del).unwrap();
    assert_eq!(c.version.to_string(), "1.0.0");
    assert_eq!(declared_version(bytes), "1.0.0");
    let bad = br#"{"name":"weft","type":"weft","cniVersion":"1.1.0","ranges":["x"],"cniVersion":"0.3.1"}"#;
    assert_eq!(declared_version(bad), "0.3.1");
    assert_eq!(
        NetworkConfig::parse(bad, Cmd::Add).unwrap_err().code,
        Code::InvalidConfig
    );
}

/// The messages a user sees for each kind of bad key, pinned word for word: the typed
/// shapes must name what was given exactly as the hand-walked JSON did.
#[test]
fn each_bad_key_is_named_as_it_was_given() {
    let add = |extra: &str| {
        NetworkConfig::parse(&conf(&format!(r#","ranges":["10.0.0.0/24"]{extra}"#)), Cmd::Add)
            .unwrap_err()
            .details
    };
    let cases = [
        (
            r#","socket":"run/weft.sock""#,
            r#"`socket` must be an absolute path, got "run/weft.sock""#,
        ),
        (r#","socket":7"#, "`socket` must be an absolute path, got 7"),
        (
            r#","mtu":"9000""#,
            r#"`mtu` must be an integer between 68 and 65535, got "9000""#,
        ),
        (
            r#","mtu":1500.5"#,
            "`mtu` must be an integer between 68 and 65535, got 1500.5",
        ),
        (
            r#","mtu":70000"#,
            "`mtu` must be an integer between 68 and 65535, got 70000",
        ),
        (
            r#","routes":{"dst":"10.1.0.0/16"}"#,
            r#"`routes`: expected a list of {"dst": CIDR} objects, got {"dst":"10.1.0.0/16"}"#,
        ),
        (
            r#","routes":["10.1.0.0/16"]"#,
            r#"`routes`: entry "10.1.0.0/16" is not an object"#,
        ),
        (
            r#","routes":[{"dst":"10.1.0.0/16","mtu":1,"table":2}]"#,
            r#"`routes`: key `mtu` in {"dst":"10.1.0.0/16","mtu":1,"table":2} is not supported: a weft route has `dst` and optionally `gw`"#,
        ),
        (
            r#","routes":[{"gw":"10.0.0.1"}]"#,
            r#"`routes`: {"gw":"10.0.0.1"} has no `dst` CIDR string"#,
        ),
        (
            r#","routes":[{"dst":"10.1.0.0/16","gw":5}]"#,
            "`routes`: gw 5 is not a string",
        ),
        (
            r#","defaultRoute":"yes""#,
            r#"`defaultRoute` must be true or false, got "yes""#,
        ),
        (
            r#","waitForLinks":30"#,
            r#"`waitForLinks`: must be a duration string such as "30s", got 30"#,
        ),
        (
            r#","runtimeConfig":{"ips":"10.0.0.7"}"#,
            r#"runtimeConfig.ips: expected a list of addresses, got "10.0.0.7""#,
        ),
        (
            r#","runtimeConfig":{"ips":[7]}"#,
            "runtimeConfig.ips: 7 is not an address string",
        ),
        (
            r#","runtimeConfig":{"mac":false}"#,
            "runtimeConfig.mac: false is not a MAC address string",
        ),
        (
            r#","runtimeConfig":{"portMappings":{}}"#,
            "runtimeConfig.portMappings: expected a list, got {}",
        ),
        (
            r#","runtimeConfig":{"portMappings":[8080]}"#,
            "runtimeConfig.portMappings: entry 8080 is not an object",
        ),
        (
            r#","runtimeConfig":{"portMappings":[{"hostPort":0,"containerPort":80}]}"#,
            r#"runtimeConfig.portMappings: hostPort must be a port number 1-65535 in {"containerPort":80,"hostPort":0}"#,
        ),
        (
            r#","runtimeConfig":{"portMappings":[{"HostPort":8080,"ContainerPort":"80"}]}"#,
            r#"runtimeConfig.portMappings: containerPort must be a port number 1-65535 in {"ContainerPort":"80","HostPort":8080}"#,
        ),
        (
            r#","runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"icmp"}]}"#,
            r#"runtimeConfig.portMappings: protocol "icmp" is not tcp, udp or sctp"#,
        ),
        (
            r#","runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":6}]}"#,
            "runtimeConfig.portMappings: protocol 6 is not tcp, udp or sctp",
        ),
        (
            r#","runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80,"hostIP":4}]}"#,
            "runtimeConfig.portMappings: hostIP 4 is not a string",
        ),
    ];
    for (extra, want) in cases {
        assert_eq!(add(extra), want, "{extra}");
    }
    let ranges = |r: &str| {
        NetworkConfig::parse(&conf(&format!(r#","ranges":{r}"#)), Cmd::Add)
            .unwrap_err()
            .details
    };
    assert_eq!(
        ranges(r#""10.0.0.0/24""#),
        r#"`ranges` must be a list of CIDR strings, got "10.0.0.0/24""#
    );
    assert_eq!(ranges("[null]"), "range null is not a CIDR string");
}
