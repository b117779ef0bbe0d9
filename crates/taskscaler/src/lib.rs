//! Taskscaler: decides how many instances exist and which job gets which slot.
//!
//! Reserve → acquire → release, as in GitLab's taskscaler. The scale decision
//! ([`decision::decide`]) is a pure function; [`Taskscaler`] runs it in a loop over an
//! [`slipway_fleeting::InstanceGroup`].

pub mod config;
pub mod decision;
pub mod policy;
pub mod scaler;

pub use config::{Config, Forecast, ScaleThrottle};
pub use policy::Policy;
pub use scaler::{Acquisition, Error, Stats, Taskscaler};
