//! The claim and address kinds a pool serves, behind one interface: a CAPI IPAddressClaim or a
//! Metal3 IPClaim, answered by a CAPI IPAddress or a Metal3 IPAddress.
//!
//! - [`claim`]: the claims (`AnyClaim`);
//! - [`status`]: what a claim's status says (`Outcome`) and how each API writes it;
//! - [`address`]: the address objects (`AnyAddress`) and the ones made for a claim (`NewAddress`).

pub mod address;
pub mod claim;
pub mod status;

pub use address::{AnyAddress, Created, FetchError, NewAddress};
pub use claim::{AnyClaim, ClaimKind};
pub use status::{Outcome, not_selected_message, refusal_message};
