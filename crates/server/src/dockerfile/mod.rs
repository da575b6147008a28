//! A Dockerfile, turned into the steps of a template build, for `airlock template build -f`
//! (which sends them to the server as the SDK's template builder does) and for the built-in
//! templates (which the server builds itself) alike: [`parse`] reads it, [`context`] packs what
//! its COPYs take from the build context, and [`steps`] turns a step as the SDK sends it into
//! the builder's (the API's build requests go through it too).

pub mod context;
pub mod parse;
pub mod steps;

pub use parse::{plan, Plan, PlanStep};
