//! Every client message of the realtime protocol: `ClientMessage::parse` on the text,
//! then `StartRequest::parse` (server defaults) or `Interaction::parse` (server limits),
//! and a checked camera update applied for one chunk as a session would.
#![no_main]

#[path = "../entries/protocol.rs"]
mod entry;
use entry::protocol;
use libfuzzer_sys::fuzz_target;
// The 256 MiB heap bound (src/lib.rs) holds only where the library is linked.
use headroom_fuzz as _;

fuzz_target!(|data: &[u8]| protocol(data));
