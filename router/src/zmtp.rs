//! The client end of ZMTP 3.0 (rfc.zeromq.org/spec/23) with the NULL mechanism: what a SUB and a
//! DEALER socket need to read vLLM's KV events (docs/kv-events.md). Hand-written on purpose: two
//! socket types over one TCP connection each, about 150 lines, where the libzmq bindings need a C++
//! build in the image and the pure-Rust `zeromq` crate brings ~30 crates and is pre-1.0.
//!
//! A connection: each side sends a 64-byte greeting (signature, version 3.0, mechanism "NULL",
//! as-server 0), then a READY command naming its socket type; then messages of frames, each
//! `flags, size, body` (flags: MORE 0x01, LONG 0x02 for an 8-byte size, COMMAND 0x04). A ZMTP 3.0
//! subscriber subscribes by sending a message whose body is 0x01 and the topic (libzmq accepts it
//! from a 3.0 peer). Commands from the peer (PING, a late READY) are read and ignored.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Larger frames end the connection (a KV event batch is kilobytes to a few megabytes).
const MAX_FRAME: u64 = 16 << 20;

pub struct Socket {
    stream: TcpStream,
}

fn greeting() -> [u8; 64] {
    let mut g = [0u8; 64];
    g[0] = 0xff;
    g[9] = 0x7f;
    g[10] = 3; // version 3.0
    g[12..16].copy_from_slice(b"NULL");
    g
}

fn ready(socket_type: &str) -> Vec<u8> {
    let mut body = vec![5u8];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    body.extend_from_slice(socket_type.as_bytes());
    frame(0x04, &body)
}

fn frame(flags: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 9);
    match u8::try_from(body.len()) {
        Ok(n) => {
            out.push(flags);
            out.push(n);
        }
        Err(_) => {
            out.push(flags | 0x02);
            out.extend_from_slice(&(body.len() as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(body);
    out
}

impl Socket {
    /// Connect to `addr` (host:port) as `socket_type` ("SUB", "DEALER") and finish the handshake.
    pub async fn connect(addr: &str, socket_type: &str) -> Result<Self, String> {
        let mut stream = TcpStream::connect(addr).await.map_err(|e| format!("connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        stream.write_all(&greeting()).await.map_err(|e| e.to_string())?;
        let mut theirs = [0u8; 64];
        stream.read_exact(&mut theirs).await.map_err(|e| format!("greeting from {addr}: {e}"))?;
        if theirs[0] != 0xff || theirs[9] != 0x7f || theirs[10] < 3 || &theirs[12..16] != b"NULL" {
            return Err(format!("{addr} does not speak ZMTP 3 with the NULL mechanism"));
        }
        stream.write_all(&ready(socket_type)).await.map_err(|e| e.to_string())?;
        let mut s = Self { stream };
        match s.frame().await? {
            (true, _, body) if body.get(1..6) == Some(b"READY".as_slice()) => Ok(s),
            _ => Err(format!("{addr} did not answer READY")),
        }
    }

    /// One frame: (command?, more?, body).
    async fn frame(&mut self) -> Result<(bool, bool, Vec<u8>), String> {
        let flags = self.stream.read_u8().await.map_err(|e| e.to_string())?;
        let size = if flags & 0x02 != 0 {
            self.stream.read_u64().await.map_err(|e| e.to_string())?
        } else {
            u64::from(self.stream.read_u8().await.map_err(|e| e.to_string())?)
        };
        if size > MAX_FRAME {
            return Err(format!("a frame of {size} bytes"));
        }
        let mut body = vec![0u8; size as usize];
        self.stream.read_exact(&mut body).await.map_err(|e| e.to_string())?;
        Ok((flags & 0x04 != 0, flags & 0x01 != 0, body))
    }

    /// The next message (its frames), skipping commands.
    pub async fn recv(&mut self) -> Result<Vec<Vec<u8>>, String> {
        let mut parts = Vec::new();
        loop {
            let (command, more, body) = self.frame().await?;
            if command {
                continue;
            }
            parts.push(body);
            if !more {
                return Ok(parts);
            }
        }
    }

    pub async fn send(&mut self, parts: &[&[u8]]) -> Result<(), String> {
        let mut out = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            out.extend_from_slice(&frame(if i + 1 < parts.len() { 0x01 } else { 0 }, p));
        }
        self.stream.write_all(&out).await.map_err(|e| e.to_string())
    }

    /// SUB: subscribe to messages whose first frame starts with `topic`.
    pub async fn subscribe(&mut self, topic: &[u8]) -> Result<(), String> {
        let mut body = vec![1u8];
        body.extend_from_slice(topic);
        self.send(&[&body]).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_the_greeting_are_zmtp_3() {
        let g = greeting();
        assert_eq!((g[0], g[9], g[10], g[11], &g[12..16], g[32]), (0xff, 0x7f, 3, 0, b"NULL".as_slice(), 0));
        assert_eq!(frame(1, b"ab"), vec![1, 2, b'a', b'b']);
        let long = frame(0, &[7u8; 300]);
        assert_eq!(&long[..9], &[2, 0, 0, 0, 0, 0, 0, 1, 44]);
        let r = ready("SUB");
        assert_eq!(&r[..3], &[4, 25, 5]);
        assert_eq!(&r[3..8], b"READY");
    }
}
