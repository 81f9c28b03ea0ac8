//! Replies: `[id, 0, result]` or `[id, 1, [kind, message, data]]`, each in its own frame.

use rmpv::Value;
use spindle_core::{Error, Reply};

use crate::frame::{begin_frame, end_frame};

/// MessagePack marker of a 3-item array.
const FIXARRAY_3: u8 = 0x93;
const STATUS_OK: u8 = 0x00;
const STATUS_ERROR: u8 = 0x01;

/// Append the frame of the reply to request `id` to `out`.
pub fn encode_reply(id: u64, reply: &Reply, out: &mut Vec<u8>) {
    match reply {
        Ok(result) => {
            let start = begin_frame(out);
            out.extend_from_slice(&[FIXARRAY_3]);
            write(out, &Value::from(id));
            out.push(STATUS_OK);
            write(out, result);
            end_frame(out, start);
        }
        Err(e) => encode_error_reply(id, e, out),
    }
}

/// Append the frame of an error reply to request `id` to `out`.
pub fn encode_error_reply(id: u64, error: &Error, out: &mut Vec<u8>) {
    let start = begin_frame(out);
    out.extend_from_slice(&[FIXARRAY_3]);
    write(out, &Value::from(id));
    out.push(STATUS_ERROR);
    out.push(FIXARRAY_3);
    write(out, &Value::from(error.kind.as_str()));
    write(out, &Value::from(error.message.as_str()));
    write(out, &error.data);
    end_frame(out, start);
}

/// The reply as a MessagePack value (for tests and tools; the server encodes directly).
pub fn reply_frame(id: u64, reply: &Reply) -> Value {
    match reply {
        Ok(result) => Value::Array(vec![id.into(), 0.into(), result.clone()]),
        Err(e) => Value::Array(vec![
            id.into(),
            1.into(),
            Value::Array(vec![e.kind.as_str().into(), e.message.as_str().into(), e.data.clone()]),
        ]),
    }
}

fn write(out: &mut Vec<u8>, value: &Value) {
    // Writing into a Vec cannot fail.
    rmpv::encode::write_value(out, value).expect("encoding into a Vec");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{read_frame, split_frame, Split};
    use spindle_core::ErrorKind;

    fn decode_one(buf: &[u8]) -> Value {
        let mut r = buf;
        let v = read_frame(&mut r, 1 << 20).unwrap().unwrap();
        assert!(r.is_empty(), "one frame expected");
        v
    }

    #[test]
    fn success_reply_shape() {
        let mut out = Vec::new();
        encode_reply(42, &Ok(Value::from("pong")), &mut out);
        assert_eq!(decode_one(&out), Value::Array(vec![42.into(), 0.into(), "pong".into()]));
        assert_eq!(decode_one(&out), reply_frame(42, &Ok(Value::from("pong"))));
    }

    #[test]
    fn error_reply_shape() {
        let err = Error::new(ErrorKind::Moved, "gone").with_data(Value::from("new"));
        let mut out = Vec::new();
        encode_reply(u64::MAX, &Err(err.clone()), &mut out);
        let expected = Value::Array(vec![
            u64::MAX.into(),
            1.into(),
            Value::Array(vec!["Moved".into(), "gone".into(), "new".into()]),
        ]);
        assert_eq!(decode_one(&out), expected);
        assert_eq!(reply_frame(u64::MAX, &Err(err)), expected);
    }

    #[test]
    fn replies_append_back_to_back() {
        let mut out = Vec::new();
        encode_reply(1, &Ok(Value::Nil), &mut out);
        let first = out.len();
        encode_reply(2, &Ok(Value::Binary(vec![7; 300])), &mut out);
        match split_frame(&out, 1 << 20) {
            Split::Frame { consumed, .. } => assert_eq!(consumed, first),
            other => panic!("expected a frame, got {other:?}"),
        }
        let mut r = &out[..];
        let a = read_frame(&mut r, 1 << 20).unwrap().unwrap();
        let b = read_frame(&mut r, 1 << 20).unwrap().unwrap();
        assert_eq!(a, Value::Array(vec![1.into(), 0.into(), Value::Nil]));
        assert_eq!(b, Value::Array(vec![2.into(), 0.into(), Value::Binary(vec![7; 300])]));
    }
}
