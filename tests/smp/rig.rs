//! The test fabric's pure parts: the net file it generates and the parsers of smpquery output.

use testkit::rig;

#[test]
fn net_file_lists_every_link_from_both_ends() {
    let net = rig::FabricSpec::new(2, 4).net_file();
    let records: Vec<&str> = net.split("\n\n").filter(|r| !r.trim().is_empty()).collect();
    assert_eq!(records.len(), 1 + 2 + 4);
    assert!(
        records[0].starts_with("Hca 1 \"smhost\"\n"),
        "SM host first"
    );
    assert!(net.contains(
        "Switch 5 \"sw1\"\n[1] \"smhost\"[1]\n[2] \"node1\"[1]\n[3] \"node3\"[1]\n[5] \"sw2\"[4]\n"
    ));
    assert!(net.contains("Hca 1 \"node4\"\n[1] \"sw2\"[2]\n"));
    // Every link appears once from each side.
    let mut ends: Vec<(String, String)> = Vec::new();
    for record in &records {
        let name = record.lines().next().unwrap().split('"').nth(1).unwrap();
        for line in record.lines().skip(1) {
            let port = &line[1..line.find(']').unwrap()];
            let peer = line.split('"').nth(1).unwrap();
            let peer_port = line.rsplit('[').next().unwrap().trim_end_matches(']');
            ends.push((format!("{name}[{port}]"), format!("{peer}[{peer_port}]")));
        }
    }
    for (a, b) in &ends {
        assert!(
            ends.contains(&(b.clone(), a.clone())),
            "{a} -> {b} has no reverse"
        );
    }
}

#[test]
fn smpquery_output_parsers() {
    let text = "# Node info: DR path slid 65535; dlid 65535; 0\nGuid:............................0x0000000000100004\nPortGuid:........................0x0000000000100005\nPartCap:.........................64\n";
    assert_eq!(rig::text_field(text, "Guid"), "0x0000000000100004");
    assert_eq!(rig::text_field(text, "PartCap"), "64");
    let pkeys = "   0: 0xffff 0x8001 0x0000 0x0000 0x0000 0x0000 0x0000 0x0000\n   8: 0x0000 0x0000 0x0000 0x0000 0x0000 0x0000 0x0000 0x0002\n16 pkeys capacity for this port\n";
    let keys = rig::parse_pkeys(pkeys);
    assert_eq!(keys.len(), 16);
    assert_eq!(&keys[..2], &[0xffff, 0x8001]);
    assert_eq!(keys[15], 2);
}
