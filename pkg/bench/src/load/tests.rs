//! Tests of `load`.

use super::*;

#[test]
fn reads_histograms_by_label() {
    let page = "# TYPE weft_cni_phase_duration_seconds histogram\n\
                weft_cni_phase_duration_seconds_sum{command=\"ADD\",phase=\"veth\"} 0.5\n\
                weft_cni_phase_duration_seconds_count{command=\"ADD\",phase=\"veth\"} 100\n\
                weft_cni_phase_duration_seconds_bucket{command=\"ADD\",phase=\"veth\",le=\"0.001\"} 3\n\
                weft_cni_phase_duration_seconds_sum{command=\"DEL\",phase=\"ipam\"} 0.1\n\
                grpc_server_handling_seconds_sum{grpc_type=\"unary\",grpc_service=\"weft.cnirpc.v1.CNI\",grpc_method=\"Add\"} 0.2\n\
                grpc_server_handling_seconds_count{grpc_type=\"unary\",grpc_service=\"weft.cnirpc.v1.CNI\",grpc_method=\"Add\"} 100\n\
                weft_pods 7\n";
    let s = Snapshot::parse(page);
    assert_eq!(s.phases[&("ADD".into(), "veth".into())], (0.5, 100.0));
    assert_eq!(s.phases[&("DEL".into(), "ipam".into())], (0.1, 0.0));
    assert_eq!(s.grpc["Add"], (0.2, 100.0));
    assert_eq!(s.pods, 7.0);
    assert_eq!(mean_between((0.1, 50.0), (0.5, 100.0)), 8.0);
    assert_eq!(mean_between((0.1, 50.0), (0.1, 50.0)), 0.0);
}

#[test]
fn failures_carry_the_cni_error() {
    let f = failure(
        "ADD",
        4,
        1,
        br#"{"cniVersion":"1.0.0","code":11,"msg":"try again","details":"busy"}"#,
    );
    assert_eq!((f.call, f.cni_code, f.msg.as_str()), (5, Some(11), "try again: busy"));
    let f = failure("DEL", 0, -1, b"garbage");
    assert_eq!((f.cni_code, f.msg.as_str()), (None, "garbage"));
}
