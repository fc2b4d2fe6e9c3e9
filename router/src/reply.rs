//! Answers the router makes itself: every error in OpenAI's shape
//! `{"error": {"message", "type", "param", "code"}}` (code: the HTTP status), and the body that
//! relays a stream chunk by chunk.

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::Response;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::sync::mpsc;

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

/// A response body fed by the relay task; each chunk carries the instant its upstream bytes
/// arrived, so the time until hyper takes it is measured (kimik3_router_added_seconds{stage="chunk_relay"}).
pub struct ChannelBody {
    pub rx: mpsc::Receiver<(Bytes, Option<Instant>)>,
}

impl HttpBody for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some((bytes, arrived))) => {
                if let Some(t) = arrived {
                    crate::metrics::METRICS.added_chunk.observe(t.elapsed());
                }
                Poll::Ready(Some(Ok(Frame::data(bytes))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
