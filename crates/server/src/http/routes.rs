//! The routes of the HTTP front end (docs/http.md): each turns a request into the request
//! the native protocol would send, passes the same permission gate ([`access::permit`]),
//! and runs it through [`calls`].

use std::collections::HashMap as StdHashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use base64::Engine as _;
use serde_json::{json, Value as Json};
use spindle_core::partition::Op;
use spindle_core::{Caller, Error, ErrorKind, Token, Value};
use spindle_proto::Request;

use super::{json as values, Front, Session, MAX_BODY, REQUEST_TIMEOUT};
use crate::access;
use crate::acl::Principal;
use crate::{calls, gateway, hosts, nested, pickles};

/// The OpenAPI 3 description of these routes.
const OPENAPI: &str = include_str!("openapi.json");

pub(super) fn router(front: Arc<Front>) -> Router {
    Router::new()
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/objects", get(list))
        .route("/v1/objects/{name}", put(create).delete(delete))
        .route("/v1/objects/{name}/{method}", post(call))
        .route("/v1/functions/{name}", post(invoke))
        .fallback(unknown_route)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(front)
}

/// A route's answer: a status and a JSON body, or an error (see [`status_of`]).
type Answer = Result<(StatusCode, Json), Error>;

/// Who makes a request: its user's rules and HTTP session.
struct Who {
    principal: Principal,
    session: Arc<Session>,
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn unknown_route(body: Body) -> Response {
    drain(body).await;
    failure(Error::new(
        ErrorKind::NotFound,
        "no such route (see GET /v1/openapi.json)",
    ))
}

async fn method_not_allowed(body: Body) -> Response {
    drain(body).await;
    let mut response = failure(Error::bad_args(
        "this route takes another method (see GET /v1/openapi.json)",
    ));
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    response
}

/// `GET /v1/objects?prefix=`: the objects this user may read, with their types and sizes.
async fn list(
    State(front): State<Arc<Front>>,
    Query(query): Query<StdHashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    answer(&headers, async {
        let who = authenticate(&front, &headers)?;
        let prefix = query.get("prefix").map_or("", String::as_str);
        let listed = calls::objects(&front.shared, prefix, false, true, Some(&who.principal));
        let rows: Vec<Json> = match listed {
            Value::Array(rows) => rows
                .iter()
                .filter_map(|row| match row.as_array()?.as_slice() {
                    [name, type_name, size] => Some(json!({
                        "name": name.as_str()?,
                        "type": type_name.as_str()?,
                        "size": size.as_u64()?,
                    })),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        Ok((StatusCode::OK, json!({ "objects": rows })))
    })
    .await
}

/// `PUT /v1/objects/{name}` `{"type", "args", "persistent"}`: 201 created, 200 when it
/// existed with that type.
async fn create(State(front): State<Arc<Front>>, Path(name): Path<String>, headers: HeaderMap, body: Body) -> Response {
    answer(&headers, async {
        let who = authenticate(&front, &headers)?;
        let mut body = read_body(&front, &headers, body).await?;
        let type_name = take_str(&mut body, "type")?.ok_or_else(|| Error::bad_args("\"type\" is required"))?;
        let args = take_args(&mut body)?;
        let persistent = match body.remove("persistent") {
            None | Some(Json::Null) => false,
            Some(Json::Bool(b)) => b,
            Some(_) => return Err(Error::bad_args("\"persistent\" must be a bool")),
        };
        refuse_unknown_fields(&body)?;
        let seq = sequence(&who, &headers)?;
        let request = Request::Create {
            id: 0,
            seq,
            thread: 0,
            type_name,
            key: name,
            args,
            owned: false,
            persistent,
            acked: 0,
            txn: None,
        };
        let created = run(&front, &who, request).await?;
        let status = match created {
            Value::Boolean(true) => StatusCode::CREATED,
            _ => StatusCode::OK,
        };
        Ok((status, json!({ "result": values::to_json(&created) })))
    })
    .await
}

/// `DELETE /v1/objects/{name}`: 200, or 404 when there was no such object.
async fn delete(State(front): State<Arc<Front>>, Path(name): Path<String>, headers: HeaderMap) -> Response {
    answer(&headers, async {
        let who = authenticate(&front, &headers)?;
        let seq = sequence(&who, &headers)?;
        let request = Request::Delete {
            id: 0,
            seq,
            key: name.clone(),
            txn: None,
        };
        match run(&front, &who, request).await? {
            Value::Boolean(false) => Err(no_object(&name)),
            deleted => Ok((StatusCode::OK, json!({ "result": values::to_json(&deleted) }))),
        }
    })
    .await
}

/// `POST /v1/objects/{name}/{method}` `{"args", "type"}`: the method's result.
async fn call(
    State(front): State<Arc<Front>>,
    Path((name, method)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(&headers, async {
        let who = authenticate(&front, &headers)?;
        let mut body = read_body(&front, &headers, body).await?;
        let args = take_args(&mut body)?;
        if let Some(kwargs) = body.remove("kwargs") {
            if !matches!(&kwargs, Json::Object(map) if map.is_empty()) && !kwargs.is_null() {
                return Err(Error::bad_args(
                    "methods take positional arguments only (\"args\"); \"kwargs\" must be empty",
                ));
            }
        }
        // The reference is (type, name): given, or the existing object's.
        let type_name = match take_str(&mut body, "type")? {
            Some(type_name) => type_name,
            None => calls::type_of(&front.shared, &name)?.ok_or_else(|| no_object(&name))?,
        };
        refuse_unknown_fields(&body)?;
        let seq = sequence(&who, &headers)?;
        let request = Request::Call {
            id: 0,
            seq,
            thread: 0,
            type_name,
            key: name,
            method,
            args,
            acked: 0,
            txn: None,
        };
        let result = run(&front, &who, request).await?;
        Ok((StatusCode::OK, json!({ "result": values::to_json(&result) })))
    })
    .await
}

/// `POST /v1/functions/{name}` `{"args", "kwargs"}`: run the function registered as `name`
/// (the pickle in the `Value` named `functions/{name}`, see Python's
/// `spindle.register_function`) on the worker pool, with plain values; its result.
async fn invoke(State(front): State<Arc<Front>>, Path(name): Path<String>, headers: HeaderMap, body: Body) -> Response {
    answer(&headers, async {
        let who = authenticate(&front, &headers)?;
        let mut body = read_body(&front, &headers, body).await?;
        let args = take_args(&mut body)?;
        let kwargs = match body.remove("kwargs") {
            None | Some(Json::Null) => Vec::new(),
            Some(Json::Object(map)) => map
                .into_iter()
                .map(|(k, v)| Ok((Value::from(k), values::to_value(v)?)))
                .collect::<Result<_, Error>>()?,
            Some(_) => return Err(Error::bad_args("\"kwargs\" must be an object")),
        };
        refuse_unknown_fields(&body)?;
        let may_invoke = Request::Invoke {
            id: 0,
            runtime: "json".into(),
            payload: Vec::new(),
            options: Value::Nil,
        };
        access::permit(&who.principal, &may_invoke)?;
        // Read as any object is (the user needs `read` on the name).
        let read = Request::Call {
            id: 0,
            seq: 0,
            thread: 0,
            type_name: "Value".into(),
            key: format!("{FUNCTIONS}{name}"),
            method: "get".into(),
            args: Vec::new(),
            acked: 0,
            txn: None,
        };
        let no_function = || {
            let message = format!("no function registered as '{name}' (Python: spindle.register_function)");
            Error::new(ErrorKind::NotFound, message)
        };
        let stored = match run(&front, &who, read).await {
            Err(e) if matches!(e.kind, ErrorKind::NotFound | ErrorKind::TypeMismatch) => return Err(no_function()),
            Ok(Value::Nil) => return Err(no_function()),
            other => other?,
        };
        let code = pickles::trusted_code(&stored)
            .map_err(|e| Error::new(e.kind, format!("function '{name}' will not run: {}", e.message)))?;
        let call = Value::Array(vec![Value::Binary(code), Value::Array(args), Value::Map(kwargs)]);
        let mut payload = Vec::new();
        rmpv::encode::write_value(&mut payload, &call).map_err(|e| Error::new(ErrorKind::Internal, e.to_string()))?;
        let (report, output) = run_function(&front, &who, &name, payload).await?;
        let field = |key: &str| match &report {
            Value::Map(entries) => entries.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v),
            _ => None,
        };
        if field("ok").and_then(Value::as_bool) == Some(true) {
            let value = field("value").map_or(Json::Null, values::to_json);
            return Ok((
                StatusCode::OK,
                json!({ "result": value, "output": values::to_json(&output) }),
            ));
        }
        let mut error = field("error").cloned().unwrap_or(Value::Nil);
        if let Value::Map(entries) = &mut error {
            entries.push((Value::from("output"), output));
        }
        let text = |key: &str| match &error {
            Value::Map(entries) => entries
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .and_then(|(_, v)| v.as_str())
                .unwrap_or("")
                .to_string(),
            _ => String::new(),
        };
        let mut raised = Error::new(ErrorKind::Raised, format!("{}: {}", text("type"), text("message")));
        raised.data = error;
        Err(raised)
    })
    .await
}

/// Where registered functions are kept: `functions/NAME` (python/spindle/compute/registered.py).
const FUNCTIONS: &str = "functions/";

/// Invoke `payload` on the `json` runtime as `who`, through the gateway as a native `invoke`
/// would, and wait for its report and what it printed (`{"stdout": ..., "stderr": ...}`, as
/// far as the gateway forwards a call's output). Given up before it came, a call still queued
/// is withdrawn.
async fn run_function(front: &Front, who: &Who, name: &str, payload: Vec<u8>) -> Result<(Value, Value), Error> {
    let shared = &front.shared;
    let req = front.next_request();
    let reply = front.mailbox.expect(req);
    let options = Value::Map(vec![
        (Value::from("function"), Value::from(name)),
        (Value::from("live"), Value::Boolean(true)),
    ]);
    let owner = who.principal.user.as_str();
    if let Err(e) = gateway::invoke(shared, front.conn, req, ("json", owner), payload, options) {
        front.mailbox.forget(req);
        return Err(e);
    }
    struct Queued<'a>(&'a Front, u64, bool);
    impl Drop for Queued<'_> {
        fn drop(&mut self) {
            if !self.2 {
                gateway::cancel(&self.0.shared, self.0.conn, self.1);
                self.0.mailbox.forget(self.1);
            }
        }
    }
    let mut queued = Queued(front, req, false);
    let reply = reply.await;
    queued.2 = true;
    let (report, output) = reply.map_err(|_| Error::new(ErrorKind::Internal, "the function's reply was lost"))?;
    let text = |bytes: &[u8]| Value::from(String::from_utf8_lossy(bytes));
    let output = Value::Map(vec![
        (Value::from("stdout"), text(&output.stdout)),
        (Value::from("stderr"), text(&output.stderr)),
    ]);
    Ok((report?, output))
}

/// Run a route's work within its time (see [`time_allowed`]), and answer its result or
/// error as JSON.
async fn answer(headers: &HeaderMap, work: impl std::future::Future<Output = Answer>) -> Response {
    let allowed = time_allowed(headers);
    match tokio::time::timeout(allowed, work).await {
        Ok(Ok((status, body))) => (status, axum::Json(body)).into_response(),
        Ok(Err(e)) => failure(e),
        Err(_) => failure(Error::new(
            ErrorKind::Timeout,
            format!("no answer within {allowed:?}: the call was withdrawn"),
        )),
    }
}

/// How long a request may take: [`REQUEST_TIMEOUT`], or less if the client says so in
/// `Spindle-Timeout` (seconds), so a client bounds a blocking call without a method argument.
fn time_allowed(headers: &HeaderMap) -> Duration {
    headers
        .get("spindle-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map_or(REQUEST_TIMEOUT, |s| Duration::from_secs_f64(s).min(REQUEST_TIMEOUT))
}

/// The caller's credentials, checked as a native `hello` checks them: `Authorization:
/// Bearer <token>` (the server's token) or `Basic` (a user and its token or password); none
/// passes only while the server needs none.
fn authenticate(front: &Front, headers: &HeaderMap) -> Result<Who, Error> {
    let unauthorized = |why: &str| Error::new(ErrorKind::Unauthorized, why.to_string());
    let (user, token) = match headers.get(header::AUTHORIZATION) {
        None => (None, None),
        Some(value) => {
            let value = value
                .to_str()
                .map_err(|_| unauthorized("the Authorization header is not text"))?;
            match value.split_once(' ') {
                Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => {
                    (None, Some(token.trim().to_string()))
                }
                Some((scheme, encoded)) if scheme.eq_ignore_ascii_case("basic") => {
                    let decoded = base64::engine::general_purpose::STANDARD
                        .decode(encoded.trim())
                        .ok()
                        .and_then(|bytes| String::from_utf8(bytes).ok())
                        .ok_or_else(|| unauthorized("Basic credentials must be base64 of user:token"))?;
                    let (user, token) = decoded
                        .split_once(':')
                        .ok_or_else(|| unauthorized("Basic credentials must be base64 of user:token"))?;
                    (Some(user.to_string()), Some(token.to_string()))
                }
                _ => {
                    return Err(unauthorized(
                        "the Authorization header takes Bearer or Basic credentials",
                    ))
                }
            }
        }
    };
    let principal = front.shared.access.authenticate(user.as_deref(), token.as_deref())?;
    let session = front.session(&principal.user);
    Ok(Who { principal, session })
}

/// Longest `Idempotency-Key`: each user's last keys are kept, so their size is bounded.
const MAX_IDEMPOTENCY_KEY: usize = 255;

/// The call's sequence number: one of the user's session for an `Idempotency-Key`, else 0
/// (not deduplicated).
fn sequence(who: &Who, headers: &HeaderMap) -> Result<u64, Error> {
    match headers.get("idempotency-key").map(HeaderValue::as_bytes) {
        Some(key) if key.len() > MAX_IDEMPOTENCY_KEY => Err(Error::bad_args(format!(
            "an Idempotency-Key has {MAX_IDEMPOTENCY_KEY} bytes at most"
        ))),
        Some(key) if !key.is_empty() => Ok(who.session.seq_of(&String::from_utf8_lossy(key))),
        _ => Ok(0),
    }
}

/// Check `request` against the user's rules, then run it as the user's session and wait
/// for its reply (which may come later, from a parked call).
async fn run(front: &Front, who: &Who, mut request: Request) -> Result<Value, Error> {
    let grant = access::permit(&who.principal, &request)?;
    if let Request::Create { args, .. } | Request::Call { args, .. } = &mut request {
        pickles::stamp(args, &who.principal)?;
    }
    let (seq, op) = match request {
        Request::Create {
            seq,
            type_name,
            key,
            args,
            persistent,
            ..
        } => {
            let op = Op::Create {
                type_name,
                key,
                args,
                owned: false,
                persistent,
            };
            (seq, op)
        }
        Request::Call {
            seq,
            type_name,
            key,
            method,
            args,
            ..
        } => {
            let op = Op::Call {
                type_name,
                key,
                method,
                args,
                nested: None,
            };
            (seq, op)
        }
        Request::Delete { seq, key, .. } => (seq, Op::Delete { key }),
        other => {
            return Err(Error::new(
                ErrorKind::Internal,
                format!("'{}' is not a call", other.op()),
            ))
        }
    };
    let shared = &front.shared;
    let token = Token {
        conn: front.conn,
        req: front.next_request(),
    };
    let caller = Caller {
        conn: front.conn,
        client: who.session.client.clone(),
        thread: 0,
    };
    let reply = front.mailbox.expect(token.req);
    // Until answered, a request that goes away (timeout, client gone) withdraws its call.
    let mut waiting = Waiting {
        front,
        token,
        key: op.key().to_string(),
        answered: false,
    };
    let mut applied = calls::apply(shared, &caller, token, (seq, 0), op, grant).inspect_err(|_| {
        waiting.answered = true;
        front.mailbox.forget(token.req);
    })?;
    let principal = Some(&who.principal);
    nested::drive_if_asked(shared, &caller, principal, (token, seq), None, &mut applied.deliveries);
    shared.registry.deliver(applied.deliveries);
    hosts::run(shared, applied.host_actions);
    let reply = reply.await;
    waiting.answered = true;
    let (reply, _) = reply.map_err(|_| Error::new(ErrorKind::Internal, "the call's reply was lost"))?;
    reply
}

/// A call waiting for its reply: dropped before the reply came, it is withdrawn (answered
/// with its timeout result, which nobody reads) so it does not stay parked.
struct Waiting<'a> {
    front: &'a Front,
    token: Token,
    key: String,
    answered: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let shared = &self.front.shared;
        if let Ok(applied) = calls::withdraw(shared, self.token, &self.key, None) {
            shared.registry.deliver(applied.deliveries);
            hosts::run(shared, applied.host_actions);
        }
        self.front.mailbox.forget(self.token.req);
    }
}

/// Bodies up to this size are read without asking the budget of bodies in progress.
const SMALL_BODY: usize = 64 << 10;

/// The request's JSON body, an object (empty when there is no body), at most [`MAX_BODY`].
/// A larger body, while it arrives, holds its size against `--max-partial-frames` with the
/// native protocol's large frames: slow clients cannot make the server hold more than that.
async fn read_body(front: &Front, headers: &HeaderMap, body: Body) -> Result<serde_json::Map<String, Json>, Error> {
    let too_large = || Error::new(ErrorKind::FrameTooLarge, format!("the body is over {MAX_BODY} bytes"));
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    // Without a length (chunked), it may be as large as allowed.
    let size = declared.map_or(MAX_BODY, |n| n as usize);
    let _held = match size > SMALL_BODY {
        true => Some(Receiving::hold(front, size)?),
        false => None,
    };
    let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(bytes) => bytes,
        Err(e) => {
            let over = std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            return Err(match over {
                true => too_large(),
                false => Error::bad_args(format!("the body could not be read: {e}")),
            });
        }
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_slice(&bytes) {
        Ok(Json::Object(map)) => Ok(map),
        Ok(_) => Err(Error::bad_args("the body must be a JSON object")),
        Err(e) => Err(Error::bad_args(format!("the body is not valid JSON: {e}"))),
    }
}

/// Bytes of a body being received, counted with the large frames of native connections
/// (`Stats::receiving`) until it has arrived or the request ends.
struct Receiving<'a> {
    front: &'a Front,
    bytes: usize,
}

impl<'a> Receiving<'a> {
    fn hold(front: &'a Front, bytes: usize) -> Result<Self, Error> {
        let total = &front.shared.stats.receiving;
        let limit = front.shared.config.limits.partial_frames;
        let before = total.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        if before + bytes > limit {
            total.fetch_sub(bytes, std::sync::atomic::Ordering::Relaxed);
            return Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "the server is receiving {before} bytes of large bodies and frames and takes {limit} at \
                     most (--max-partial-frames): a body of {bytes} bytes must wait; try again later"
                ),
            ));
        }
        Ok(Receiving { front, bytes })
    }
}

impl Drop for Receiving<'_> {
    fn drop(&mut self) {
        let total = &self.front.shared.stats.receiving;
        total.fetch_sub(self.bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Read and drop a body nobody needs, so the connection stays usable (hyper closes one
/// whose request body was left unread).
async fn drain(body: Body) {
    let _ = axum::body::to_bytes(body, MAX_BODY).await;
}

fn take_args(body: &mut serde_json::Map<String, Json>) -> Result<Vec<Value>, Error> {
    match body.remove("args") {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Array(items)) => items.into_iter().map(values::to_value).collect(),
        Some(_) => Err(Error::bad_args("\"args\" must be an array")),
    }
}

fn take_str(body: &mut serde_json::Map<String, Json>, field: &str) -> Result<Option<String>, Error> {
    match body.remove(field) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s)),
        Some(_) => Err(Error::bad_args(format!("\"{field}\" must be a string"))),
    }
}

/// A field nobody reads is a mistake the client should hear of (a misspelt "args").
fn refuse_unknown_fields(body: &serde_json::Map<String, Json>) -> Result<(), Error> {
    match body.keys().next() {
        Some(field) => Err(Error::bad_args(format!("unknown field \"{field}\""))),
        None => Ok(()),
    }
}

fn no_object(name: &str) -> Error {
    Error::new(ErrorKind::NotFound, format!("no object named '{name}'"))
}

/// An error as JSON: `{"error": {"type", "message", "data"}}` with its status, and where to
/// go (`Spindle-Leader`) or how to authenticate (`WWW-Authenticate`) when that helps.
pub(super) fn failure(e: Error) -> Response {
    let status = status_of(e.kind);
    let mut body = json!({ "error": { "type": e.kind.as_str(), "message": e.message } });
    if !e.data.is_nil() {
        body["error"]["data"] = values::to_json(&e.data);
    }
    let mut response = (status, axum::Json(body)).into_response();
    let headers = response.headers_mut();
    match e.kind {
        ErrorKind::Unauthorized => {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer, Basic realm=\"spindle\""),
            );
        }
        ErrorKind::NotLeader => {
            if let Some(leader) = e.data.as_str().and_then(|a| HeaderValue::from_str(a).ok()) {
                headers.insert("spindle-leader", leader);
            }
        }
        ErrorKind::Busy => {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        _ => {}
    }
    response
}

/// The HTTP status of an error kind (docs/http.md, "Errors"). Errors a method raised on
/// purpose (an empty queue, a missing dict key, a broken barrier) are 422: the request was
/// understood and ran.
fn status_of(kind: ErrorKind) -> StatusCode {
    use ErrorKind as K;
    match kind {
        K::NotFound | K::UnknownMethod => StatusCode::NOT_FOUND,
        K::TypeMismatch => StatusCode::CONFLICT,
        K::ProtocolError | K::UnknownType | K::BadArguments | K::ValueError | K::OverflowError => {
            StatusCode::BAD_REQUEST
        }
        K::Timeout | K::FunctionTimeout => StatusCode::REQUEST_TIMEOUT,
        K::NotLeader | K::Busy => StatusCode::SERVICE_UNAVAILABLE,
        K::Unauthorized => StatusCode::UNAUTHORIZED,
        K::PermissionDenied => StatusCode::FORBIDDEN,
        K::FrameTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        K::OutOfMemory => StatusCode::INSUFFICIENT_STORAGE,
        K::Internal | K::NoSession | K::StorageError | K::ObjectLost | K::WorkerCrashed | K::NestedCall => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        K::KeyError
        | K::IndexError
        | K::RuntimeError
        | K::BrokenBarrier
        | K::Empty
        | K::Full
        | K::InvalidState
        | K::Cancelled
        | K::FutureException
        | K::Moved
        | K::Raised
        | K::TransactionConflict
        | K::TransactionError
        | K::Trapped => StatusCode::UNPROCESSABLE_ENTITY,
    }
}
