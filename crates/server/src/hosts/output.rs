//! An object host's stdout and stderr: read as they come, so a host never blocks on a full
//! pipe; logged line by line under the host's id; and capped, so that a method printing in
//! a loop cannot flood the server's log: past `BUDGET` bytes in a minute the rest of that
//! minute's output is dropped, and a line says so and, once the minute is over, how much.

use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt};

use super::HostId;

/// Output bytes logged per host stream and minute.
const BUDGET: u64 = 64 * 1024;
const WINDOW: Duration = Duration::from_secs(60);
/// Longer lines are cut here.
const LONGEST_LINE: usize = 1024;

/// Read `stream` (the host's `name`, "stdout" or "stderr") until it closes, logging it.
pub(crate) fn drain(id: HostId, name: &'static str, mut stream: impl AsyncRead + Unpin + Send + 'static) {
    tokio::spawn(async move {
        let mut cap = Cap::new(Instant::now());
        let mut line = Vec::new();
        let mut cut = false;
        let mut chunk = vec![0u8; 8 * 1024];
        while let Ok(n) = stream.read(&mut chunk).await {
            if n == 0 {
                break;
            }
            for &byte in &chunk[..n] {
                if byte != b'\n' {
                    if line.len() < LONGEST_LINE {
                        line.push(byte);
                    } else {
                        cut = true;
                    }
                    continue;
                }
                log_line(id, name, &mut cap, &line, cut);
                line.clear();
                cut = false;
            }
        }
        if !line.is_empty() {
            log_line(id, name, &mut cap, &line, cut);
        }
    });
}

fn log_line(id: HostId, name: &'static str, cap: &mut Cap, line: &[u8], cut: bool) {
    let text = String::from_utf8_lossy(line);
    let more = if cut { " [cut]" } else { "" };
    match cap.admit(line.len() as u64 + 1, Instant::now()) {
        Admit::Log { dropped: 0 } => tracing::info!(host = id, stream = name, "{text}{more}"),
        Admit::Log { dropped } => {
            tracing::warn!(
                host = id,
                stream = name,
                "{dropped} bytes of output dropped in the last minute (over {BUDGET} a minute)"
            );
            tracing::info!(host = id, stream = name, "{text}{more}");
        }
        Admit::DropFirst => {
            tracing::warn!(
                host = id,
                stream = name,
                "output over {BUDGET} bytes in a minute: the rest of this minute's is dropped"
            )
        }
        Admit::Drop => {}
    }
}

/// The budget of one stream: bytes in the current minute, and what was dropped of it.
struct Cap {
    window: Instant,
    used: u64,
    dropped: u64,
}

#[derive(Debug, PartialEq)]
enum Admit {
    /// Log it; `dropped` bytes of the minute before were not (say so first).
    Log {
        dropped: u64,
    },
    /// The first line over the budget this minute: say that the rest is dropped.
    DropFirst,
    Drop,
}

impl Cap {
    fn new(now: Instant) -> Self {
        Cap {
            window: now,
            used: 0,
            dropped: 0,
        }
    }

    fn admit(&mut self, bytes: u64, now: Instant) -> Admit {
        let mut dropped = 0;
        if now.duration_since(self.window) >= WINDOW {
            dropped = std::mem::take(&mut self.dropped);
            self.window = now;
            self.used = 0;
        }
        if self.used + bytes <= BUDGET {
            self.used += bytes;
            return Admit::Log { dropped };
        }
        self.used = BUDGET;
        self.dropped += bytes;
        match self.dropped == bytes {
            true => Admit::DropFirst,
            false => Admit::Drop,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minute_logs_its_budget_then_drops_and_the_next_says_how_much() {
        let t0 = Instant::now();
        let mut cap = Cap::new(t0);
        assert_eq!(cap.admit(BUDGET - 10, t0), Admit::Log { dropped: 0 });
        assert_eq!(cap.admit(10, t0), Admit::Log { dropped: 0 });
        assert_eq!(cap.admit(5, t0), Admit::DropFirst);
        assert_eq!(cap.admit(7, t0 + Duration::from_secs(59)), Admit::Drop);
        assert_eq!(cap.admit(3, t0 + WINDOW), Admit::Log { dropped: 12 });
        assert_eq!(
            cap.admit(BUDGET, t0 + WINDOW),
            Admit::DropFirst,
            "the new minute has its own budget"
        );
    }
}
