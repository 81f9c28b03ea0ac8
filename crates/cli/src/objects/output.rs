//! Values printed the way a shell reads them: integers plainly, strings and bytes raw, nil as
//! nothing, a list one item per line (so `for k in $(map -n m keySet)` works).

use std::io::{self, BufWriter, ErrorKind, StdoutLock, Write};

use spindle_core::Value;

use super::{Exit, Outcome};

/// Standard output. A reader that went away (`EPIPE`) ends the command quietly with status
/// 141, as a shell reports a command killed by SIGPIPE.
pub(crate) struct Out {
    stdout: BufWriter<StdoutLock<'static>>,
}

impl Out {
    pub fn new() -> Out {
        Out {
            stdout: BufWriter::with_capacity(64 * 1024, io::stdout().lock()),
        }
    }

    pub fn raw(&mut self, bytes: &[u8]) -> Outcome {
        self.stdout.write_all(bytes).map_err(broken)
    }

    /// `value` on a line of its own.
    pub fn line(&mut self, value: &Value) -> Outcome {
        let mut text = Vec::new();
        render(value, &mut text);
        text.push(b'\n');
        self.raw(&text)
    }

    /// A list one item per line; anything else as [`Self::line`].
    pub fn lines(&mut self, value: &Value) -> Outcome {
        match value {
            Value::Array(items) => items.iter().try_for_each(|item| self.line(item)),
            other => self.line(other),
        }
    }

    /// `[[k, v], ...]` as `k=v` lines.
    pub fn entries(&mut self, items: &Value) -> Outcome {
        for item in items.as_array().into_iter().flatten() {
            let mut text = Vec::new();
            match item.as_array().map(Vec::as_slice) {
                Some([k, v]) => {
                    render(k, &mut text);
                    text.push(b'=');
                    render(v, &mut text);
                }
                _ => render(item, &mut text),
            }
            text.push(b'\n');
            self.raw(&text)?;
        }
        Ok(())
    }

    pub fn flush(&mut self) -> Outcome {
        self.stdout.flush().map_err(broken)
    }
}

/// The exit status of a command whose stdout was closed (128 + SIGPIPE, as a shell reports).
pub(crate) const BROKEN_PIPE: u8 = 141;

fn broken(e: io::Error) -> Exit {
    if e.kind() == ErrorKind::BrokenPipe {
        Exit::Silent(BROKEN_PIPE)
    } else {
        Exit::Error(format!("cannot write to stdout: {e}"))
    }
}

/// One value as text: strings and bytes raw, numbers as Python prints them, containers in
/// brackets (`[1, a]`, `{k: v}`, `(1, 2)` for a tuple).
pub(crate) fn render(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Nil => {}
        Value::Boolean(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Integer(n) => out.extend_from_slice(n.to_string().as_bytes()),
        Value::F32(x) => out.extend_from_slice(float(f64::from(*x)).as_bytes()),
        Value::F64(x) => out.extend_from_slice(float(*x).as_bytes()),
        Value::String(s) => out.extend_from_slice(s.as_bytes()),
        Value::Binary(b) => out.extend_from_slice(b),
        Value::Array(items) => sequence(b'[', items, b']', out),
        Value::Map(entries) => {
            out.push(b'{');
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    out.extend_from_slice(b", ");
                }
                render(k, out);
                out.extend_from_slice(b": ");
                render(v, out);
            }
            out.push(b'}');
        }
        Value::Ext(..) => match spindle_core::value::tuple_items(value) {
            Some(items) => sequence(b'(', &items, b')', out),
            None => out.extend_from_slice(b"<object>"),
        },
    }
}

fn sequence(open: u8, items: &[Value], close: u8, out: &mut Vec<u8>) {
    out.push(open);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(b", ");
        }
        match item {
            Value::Nil => out.extend_from_slice(b"None"),
            item => render(item, out),
        }
    }
    out.push(close);
}

/// A float as Python's `repr` would write it (`2.0`, `0.1`, `1e+300` as `1e300`).
fn float(x: f64) -> String {
    if x.is_nan() {
        "nan".into()
    } else {
        format!("{x:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(v: &Value) -> String {
        let mut out = Vec::new();
        render(v, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn values_print_as_a_shell_expects() {
        assert_eq!(text(&Value::from(-3)), "-3");
        assert_eq!(text(&Value::F64(2.0)), "2.0");
        assert_eq!(text(&Value::F64(0.1)), "0.1");
        assert_eq!(text(&Value::from("a b")), "a b");
        assert_eq!(text(&Value::Nil), "");
        assert_eq!(text(&Value::Boolean(true)), "true");
        assert_eq!(
            text(&Value::Array(vec![1.into(), "x".into(), Value::Nil])),
            "[1, x, None]"
        );
    }
}
