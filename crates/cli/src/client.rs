//! A small blocking client for `spindle status` and `spindle objects`.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use spindle_core::Value;
use spindle_proto::{read_frame, write_frame, DEFAULT_MAX_FRAME};

const TIMEOUT: Duration = Duration::from_secs(5);

struct Client {
    stream: TcpStream,
    address: String,
    next_id: u64,
}

impl Client {
    fn connect(address: &str) -> Result<Client, String> {
        let targets = address
            .to_socket_addrs()
            .map_err(|e| format!("bad server address '{address}': {e}"))?;
        let mut last_error = None;
        for target in targets {
            match TcpStream::connect_timeout(&target, TIMEOUT) {
                Ok(stream) => {
                    let _ = stream.set_read_timeout(Some(TIMEOUT));
                    let _ = stream.set_nodelay(true);
                    let mut client = Client {
                        stream,
                        address: address.to_string(),
                        next_id: 1,
                    };
                    client.hello()?;
                    return Ok(client);
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(match last_error {
            Some(e) => format!("no Spindle server at {address} ({e}); start one with `spindle server`"),
            None => format!("bad server address '{address}': it resolves to nothing"),
        })
    }

    fn hello(&mut self) -> Result<(), String> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let client = format!("spindle-cli-{}-{nanos}", std::process::id());
        let hello = Value::Map(vec![
            ("client".into(), client.into()),
            ("protocol".into(), spindle_proto::PROTOCOL_VERSION.into()),
        ]);
        self.request("hello", vec![hello]).map(drop)
    }

    fn request(&mut self, op: &str, operands: Vec<Value>) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        let mut items = vec![Value::from(id), Value::from(op)];
        items.extend(operands);
        let address = self.address.clone();
        let lost = |e: &dyn std::fmt::Display| format!("lost the connection to {address}: {e}");
        write_frame(&mut self.stream, &Value::Array(items)).map_err(|e| lost(&e))?;
        let reply = read_frame(&mut self.stream, DEFAULT_MAX_FRAME)
            .map_err(|e| lost(&e))?
            .ok_or_else(|| lost(&"the server closed the connection"))?;
        match reply {
            Value::Array(items) if items.len() == 3 && items[0].as_u64() == Some(id) => match items[1].as_u64() {
                Some(0) => Ok(items.into_iter().nth(2).unwrap_or(Value::Nil)),
                _ => Err(format!("the server refused '{op}': {}", describe_error(&items[2]))),
            },
            other => Err(format!("unexpected reply from {}: {other}", self.address)),
        }
    }
}

fn describe_error(error: &Value) -> String {
    match error {
        Value::Array(parts) if parts.len() >= 2 => format!(
            "{}: {}",
            parts[0].as_str().unwrap_or("?"),
            parts[1].as_str().unwrap_or("?")
        ),
        other => other.to_string(),
    }
}

fn field<'a>(map: &'a Value, name: &str) -> Option<&'a Value> {
    map.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(name))
        .map(|(_, v)| v)
}

fn format_uptime(seconds: f64) -> String {
    let total = seconds.max(0.0) as u64;
    let (days, hours, minutes, secs) = (total / 86_400, total / 3600 % 24, total / 60 % 60, total % 60);
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{secs}s"),
        (0, 0, _) => format!("{minutes}m {secs:02}s"),
        (0, _, _) => format!("{hours}h {minutes:02}m {secs:02}s"),
        _ => format!("{days}d {hours:02}h {minutes:02}m"),
    }
}

/// `spindle status`.
pub fn status(address: &str) -> Result<(), String> {
    let status = Client::connect(address)?.request("status", vec![])?;
    let text = |name: &str| match field(&status, name) {
        Some(Value::String(s)) => s.as_str().unwrap_or("?").to_string(),
        Some(Value::F64(x)) => format!("{x:.1}"),
        Some(Value::F32(x)) => format!("{x:.1}"),
        Some(Value::Nil) => "-".to_string(),
        Some(other) => other.to_string(),
        None => "?".to_string(),
    };
    let uptime = field(&status, "uptime")
        .and_then(Value::as_f64)
        .map_or("?".into(), format_uptime);
    let rows = [
        ("address", text("address")),
        ("version", text("version")),
        ("pid", text("pid")),
        ("uptime", uptime),
        ("objects", text("objects")),
        ("persistent", text("persistent_objects")),
        ("data dir", text("data_dir")),
        ("connections", text("connections")),
        ("sessions", text("sessions")),
        ("partitions", text("partitions")),
        ("calls", text("calls")),
        ("calls/s", text("calls_per_s")),
        ("workers", format!("{} of {}", text("workers"), text("max_workers"))),
        ("busy", text("busy")),
        ("queued", text("queued")),
        ("invocations/s", text("invocations_per_s")),
    ];
    for (label, value) in rows {
        println!("{label:<14} {value}");
    }
    Ok(())
}

/// `spindle objects [PREFIX] [--persistent]`: one `name  type` line per named object.
pub fn objects(address: &str, prefix: &str, persistent: bool) -> Result<(), String> {
    let listing =
        Client::connect(address)?.request("objects", vec![Value::from(prefix), Value::Boolean(persistent)])?;
    let rows: Vec<(String, String)> = listing
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|item| {
                    let pair = item.as_array()?;
                    Some((pair.first()?.as_str()?.to_string(), pair.get(1)?.as_str()?.to_string()))
                })
                .collect()
        })
        .unwrap_or_default();
    let width = rows.iter().map(|(name, _)| name.chars().count()).max().unwrap_or(0);
    for (name, type_name) in rows {
        println!("{name:<width$}  {type_name}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::format_uptime;

    #[test]
    fn uptime_reads_naturally() {
        assert_eq!(format_uptime(4.7), "4s");
        assert_eq!(format_uptime(65.0), "1m 05s");
        assert_eq!(format_uptime(3.0 * 3600.0 + 61.0), "3h 01m 01s");
        assert_eq!(format_uptime(2.0 * 86_400.0 + 3600.0), "2d 01h 00m");
    }
}
