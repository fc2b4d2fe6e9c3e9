//! Minimal logging to stderr: `<unix seconds> <LEVEL> <message>`, level from RUST_LOG
//! (`error`, `warn`, `info` (default), `debug`; a `target=level` list uses its last level word).
//! No session key, header value or prompt is ever logged at info or above.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

static LEVEL: AtomicU8 = AtomicU8::new(2);

pub fn init() {
    let spec = std::env::var("RUST_LOG").unwrap_or_default().to_ascii_lowercase();
    let mut level = 2;
    for word in spec.split([',', '=']) {
        level = match word.trim() {
            "error" => 0,
            "warn" => 1,
            "info" => 2,
            "debug" | "trace" => 3,
            _ => level,
        };
    }
    LEVEL.store(level, Ordering::Relaxed);
}

pub fn enabled(level: u8) -> bool {
    level <= LEVEL.load(Ordering::Relaxed)
}

pub fn write(level: u8, args: std::fmt::Arguments<'_>) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let name = ["ERROR", "WARN", "INFO", "DEBUG"].get(level as usize).copied().unwrap_or("DEBUG");
    eprintln!("{}.{:03} {name} {args}", now.as_secs(), now.subsec_millis());
}

#[macro_export]
macro_rules! error { ($($t:tt)*) => { if $crate::log::enabled(0) { $crate::log::write(0, format_args!($($t)*)) } } }
#[macro_export]
macro_rules! warn { ($($t:tt)*) => { if $crate::log::enabled(1) { $crate::log::write(1, format_args!($($t)*)) } } }
#[macro_export]
macro_rules! info { ($($t:tt)*) => { if $crate::log::enabled(2) { $crate::log::write(2, format_args!($($t)*)) } } }
#[macro_export]
macro_rules! debug { ($($t:tt)*) => { if $crate::log::enabled(3) { $crate::log::write(3, format_args!($($t)*)) } } }
