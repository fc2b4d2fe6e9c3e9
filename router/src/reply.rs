//! Answers the router makes itself: every error in OpenAI's shape
//! `{"error": {"message", "type", "param", "code"}}` (code: the HTTP status), and the end of a cut
//! stream.

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::Response;
use serde_json::{Value, json};
use std::convert::Infallible;

pub type Body = BoxBody<Bytes, Infallible>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into()).boxed()
}

pub fn error_value(status: u16, kind: &str, message: &str) -> Value {
    json!({"error": {"message": message, "type": kind, "param": Value::Null, "code": status}})
}

pub fn json_response(status: u16, value: &Value) -> Response<Body> {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let mut resp = Response::new(full(bytes));
    *resp.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    resp
}

pub fn error(status: u16, kind: &str, message: &str) -> Response<Body> {
    json_response(status, &error_value(status, kind, message))
}

/// The end of a cut stream, as vLLM itself ends a stream that fails: an error event in the OpenAI
/// error shape, then `[DONE]`. OpenAI's clients raise on the error event (they check every
/// event's `error` before they look for `[DONE]`).
pub fn sse_error(status: u16, kind: &str, message: &str) -> Bytes {
    let event = serde_json::to_string(&error_value(status, kind, message)).unwrap_or_default();
    Bytes::from(format!("data: {event}\n\ndata: [DONE]\n\n"))
}
