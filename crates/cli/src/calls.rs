//! `spindle ps`, `spindle kill ID` and `spindle logs ID [-f]`: the server's function calls
//! (the `calls` request, docs/protocol.md "Calls"). A user sees and kills its own calls; an
//! admin everyone's.

use std::io::Write;

use clap::Args;
use spindle_core::Value;

use crate::client::{field, remote, Client};
use crate::AddressArg;

#[derive(Args)]
pub(crate) struct KillArgs {
    /// The call's id (from `spindle ps`).
    id: u64,
    #[command(flatten)]
    address: AddressArg,
}

#[derive(Args)]
pub(crate) struct LogsArgs {
    /// The call's id (from `spindle ps`).
    id: u64,
    /// Keep printing its output as it comes, until the call ends.
    #[arg(short, long)]
    follow: bool,
    #[command(flatten)]
    address: AddressArg,
}

/// `spindle ps`: one line per running or queued call.
pub(crate) fn ps(address: &AddressArg) -> Result<(), String> {
    crate::client::use_tls(&address.tls);
    let listing = Client::connect(&address.address)?.request("calls", vec!["list".into()])?;
    let rows = listing.as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        println!("no calls are running or queued");
        return Ok(());
    }
    let text = |row: &Value, name: &str| match field(row, name) {
        Some(Value::String(s)) => s.as_str().unwrap_or("?").to_string(),
        Some(Value::Nil) | None => "-".to_string(),
        Some(Value::F64(age)) => format!("{age:.1}s"),
        Some(other) => other.to_string(),
    };
    let table: Vec<[String; 7]> = rows
        .iter()
        .map(|row| ["id", "state", "age", "worker", "user", "function", "caller"].map(|name| text(row, name)))
        .collect();
    let header = ["ID", "STATE", "AGE", "WORKER", "USER", "FUNCTION", "CALLER"].map(str::to_string);
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in &table {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&table) {
        let line: Vec<String> = row.iter().zip(widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        println!("{}", line.join("  ").trim_end());
    }
    Ok(())
}

/// `spindle kill ID`.
pub(crate) fn kill(args: KillArgs) -> Result<(), String> {
    crate::client::use_tls(&args.address.tls);
    let mut client = Client::connect(&args.address.address)?;
    client.request("calls", vec!["kill".into(), args.id.into()])?;
    println!("killed call {}", args.id);
    Ok(())
}

/// `spindle logs ID [-f]`: the call's latest output (the server keeps its last 64 KiB), and
/// with `-f` the rest as it comes, until it ends.
pub(crate) fn logs(args: LogsArgs) -> Result<(), String> {
    crate::client::use_tls(&args.address.tls);
    let mut client = Client::connect(&args.address.address)?;
    let operands = vec!["logs".into(), args.id.into(), args.follow.into()];
    let id = client.send("calls", operands).map_err(|e| e.to_string())?;
    loop {
        let (reply_id, status, value) = client.receive_frame().map_err(|e| e.to_string())?;
        if reply_id != id {
            continue;
        }
        match status {
            2 => print_chunk(&value)?,
            0 => {
                if let Some(Value::Integer(n)) = field(&value, "dropped") {
                    if n.as_u64().unwrap_or(0) > 0 {
                        eprintln!("spindle logs: ({n} bytes of output were over the limit and dropped)");
                    }
                }
                return Ok(());
            }
            _ => {
                let r = remote(&value);
                return Err(format!("{}: {}", r.kind, r.message));
            }
        }
    }
}

/// A chunk `{"stdout"|"stderr": bytes}` to our own stream.
fn print_chunk(chunk: &Value) -> Result<(), String> {
    for (stream, bytes) in chunk.as_map().into_iter().flatten() {
        let Value::Binary(bytes) = bytes else { continue };
        let written = match stream.as_str() {
            Some("stderr") => std::io::stderr()
                .write_all(bytes)
                .and_then(|()| std::io::stderr().flush()),
            _ => std::io::stdout()
                .write_all(bytes)
                .and_then(|()| std::io::stdout().flush()),
        };
        written.map_err(|e| format!("cannot write the output: {e}"))?;
    }
    Ok(())
}
