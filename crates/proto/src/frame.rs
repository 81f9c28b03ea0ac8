//! Frames: a `u32` big-endian body length, then one MessagePack value.

use std::io::{self, Read, Write};

use rmpv::Value;

/// Bytes of the length prefix.
pub const HEADER_LEN: usize = 4;

/// The server's default limit on a frame body (`spindle server --max-frame`).
pub const DEFAULT_MAX_FRAME: usize = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes is over the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("connection closed in the middle of a frame")]
    Truncated,
    #[error("frame body is not valid MessagePack: {0}")]
    Decode(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// What [`split_frame`] found at the start of a read buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Split<'a> {
    /// A whole frame: its body, and how many buffer bytes it took (header included).
    Frame { body: &'a [u8], consumed: usize },
    /// Not a whole frame yet; `total` is the size of the frame (header included) once the
    /// header is known, so the caller can grow its buffer once.
    Incomplete { total: Option<usize> },
    /// The header announces a body over `max`; the caller should refuse it and close.
    TooLarge { len: usize },
}

/// Look for one frame at the start of `buf` without copying.
pub fn split_frame(buf: &[u8], max: usize) -> Split<'_> {
    let Some(header) = buf.first_chunk::<HEADER_LEN>() else {
        return Split::Incomplete { total: None };
    };
    let len = u32::from_be_bytes(*header) as usize;
    if len > max {
        return Split::TooLarge { len };
    }
    let total = HEADER_LEN + len;
    if buf.len() < total {
        return Split::Incomplete { total: Some(total) };
    }
    Split::Frame {
        body: &buf[HEADER_LEN..total],
        consumed: total,
    }
}

/// Append the frame of `value` to `out`.
pub fn encode_frame(value: &Value, out: &mut Vec<u8>) {
    let start = begin_frame(out);
    // Writing into a Vec cannot fail.
    rmpv::encode::write_value(out, value).expect("encoding into a Vec");
    end_frame(out, start);
}

/// Reserve the length prefix of a frame about to be written into `out`; returns its offset.
pub(crate) fn begin_frame(out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_LEN]);
    start
}

/// Fill in the length prefix reserved by [`begin_frame`].
pub(crate) fn end_frame(out: &mut [u8], start: usize) {
    let len = out.len() - start - HEADER_LEN;
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    out[start..start + HEADER_LEN].copy_from_slice(&len.to_be_bytes());
}

/// Write one frame to a blocking writer (the CLI's client side).
pub fn write_frame(w: &mut impl Write, value: &Value) -> io::Result<()> {
    let mut buf = Vec::new();
    encode_frame(value, &mut buf);
    w.write_all(&buf)?;
    w.flush()
}

/// Read one frame from a blocking reader. `Ok(None)` on a clean end of stream.
pub fn read_frame(r: &mut impl Read, max: usize) -> Result<Option<Value>, FrameError> {
    let mut header = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(FrameError::Truncated),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = u32::from_be_bytes(header) as usize;
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => FrameError::Truncated,
        _ => FrameError::Io(e),
    })?;
    let mut slice = &body[..];
    let value = rmpv::decode::read_value(&mut slice).map_err(|e| FrameError::Decode(e.to_string()))?;
    Ok(Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_waits_for_header_and_body() {
        assert_eq!(split_frame(&[0, 0], 10), Split::Incomplete { total: None });
        assert_eq!(split_frame(&[0, 0, 0, 3, 1], 10), Split::Incomplete { total: Some(7) });
        let buf = [0, 0, 0, 2, 0xc0, 0xc3, 9];
        assert_eq!(
            split_frame(&buf, 10),
            Split::Frame {
                body: &[0xc0, 0xc3],
                consumed: 6
            }
        );
    }

    #[test]
    fn split_refuses_oversized_frames_from_the_header_alone() {
        assert_eq!(split_frame(&[0, 0, 1, 0], 255), Split::TooLarge { len: 256 });
        assert!(matches!(split_frame(&[0, 0, 0, 255], 255), Split::Incomplete { .. }));
    }

    #[test]
    fn empty_body_is_a_frame() {
        assert_eq!(split_frame(&[0, 0, 0, 0], 0), Split::Frame { body: &[], consumed: 4 });
    }

    #[test]
    fn encode_then_read_round_trips() {
        let value = Value::Array(vec![Value::from(7), Value::from("ping")]);
        let mut buf = Vec::new();
        encode_frame(&value, &mut buf);
        encode_frame(&Value::Nil, &mut buf);
        assert_eq!(&buf[..4], &(buf.len() as u32 - 4 - 5).to_be_bytes());
        let mut reader = &buf[..];
        assert_eq!(read_frame(&mut reader, 100).unwrap(), Some(value));
        assert_eq!(read_frame(&mut reader, 100).unwrap(), Some(Value::Nil));
        assert_eq!(read_frame(&mut reader, 100).unwrap(), None);
    }

    #[test]
    fn read_reports_truncation_and_limits() {
        let mut cut: &[u8] = &[0, 0, 0, 5, 1, 2];
        assert!(matches!(read_frame(&mut cut, 100), Err(FrameError::Truncated)));
        let mut half_header: &[u8] = &[0, 0];
        assert!(matches!(read_frame(&mut half_header, 100), Err(FrameError::Truncated)));
        let mut big: &[u8] = &[0, 0, 1, 0];
        assert!(matches!(
            read_frame(&mut big, 10),
            Err(FrameError::TooLarge { len: 256, max: 10 })
        ));
    }
}
