//! What a template build runs inside its build sandbox, with the agent's own static binary (an
//! image may have nothing else to run them with): `airlock-agent unpack-layer` and
//! `airlock-agent provision`.

pub mod provision;
pub mod unpack_layer;
