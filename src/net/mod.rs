//! What bitpool's servers (webhooks, health, diagnostics) share: the listener loop and TLS.

pub mod http;
pub mod tls;
