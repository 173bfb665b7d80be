//! `attach --port`: a port of the instance as the agent's `PortName` takes it.

use crate::proto::agent::PortName;

/// Parses `DEVICE/PORT` (`mlx5_0/1`, port 1-255) or a port GUID (`0x` and 1-16 hex digits),
/// passed on as written (the agent checks that the port is one of its fabric ports).
pub fn parse_port(s: &str) -> Result<PortName, String> {
    if let Some((device, port)) = s.rsplit_once('/') {
        let port_number: u32 = port
            .parse()
            .map_err(|_| format!("{s:?}: the port number after '/' must be 1-255"))?;
        if device.is_empty() || !(1..=255).contains(&port_number) {
            return Err(format!("{s:?} is not DEVICE/PORT (e.g. mlx5_0/1)"));
        }
        return Ok(PortName {
            device: device.to_owned(),
            port_number,
            port_guid: String::new(),
        });
    }
    let hex = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .filter(|h| (1..=16).contains(&h.len()) && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| {
            format!("{s:?} is neither DEVICE/PORT (mlx5_0/1) nor a port GUID (0x0002c903000e0b72)")
        })?;
    if u64::from_str_radix(hex, 16) == Ok(0) {
        return Err(format!("{s:?}: a port GUID is not zero"));
    }
    Ok(PortName {
        port_guid: s.to_owned(),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::parse_port;

    #[test]
    fn devices_and_guids_parse_and_bad_names_are_refused_with_the_name() {
        let p = parse_port("mlx5_0/1").unwrap();
        assert_eq!((p.device.as_str(), p.port_number), ("mlx5_0", 1));
        assert!(p.port_guid.is_empty());
        let g = parse_port("0x0002c903000e0b72").unwrap();
        assert_eq!(g.port_guid, "0x0002c903000e0b72");
        assert!(g.device.is_empty());
        for bad in [
            "mlx5_0/0",
            "mlx5_0/256",
            "/1",
            "mlx5_0/x",
            "zz",
            "0x",
            "0x0",
            "0x12345678901234567",
        ] {
            let e = parse_port(bad).expect_err(bad);
            assert!(e.contains(bad), "{e}");
        }
    }
}
