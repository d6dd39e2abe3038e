//! What bitpool's servers (webhooks, health, diagnostics) share: the listener loop, TLS, and
//! the authorization decisions they remember.

pub mod decisions;
pub mod http;
pub mod tls;
