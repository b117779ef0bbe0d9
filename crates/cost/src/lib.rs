//! What a fleet costs, and who used it.
//!
//! - [`price`]: a shape's price per hour and its currency, as config.toml writes them.
//! - [`share`]: a job's share of its instance (the larger of its CPU and memory fractions).
//! - [`ledger`]: instances billed per second with a minimum, jobs charged their share over the
//!   time they held their slots, and the rest kept apart as the runner's overhead.

pub mod ledger;
pub mod price;
pub mod share;

pub use ledger::{Costs, JobCost, Ledger, Settled};
pub use price::{Money, Price, PriceError};
pub use share::share_of;
