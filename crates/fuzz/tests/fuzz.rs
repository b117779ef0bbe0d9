//! Every fuzz target for a few seconds (`make fuzz` runs them long): a test fails only on a
//! panic or a broken invariant.

use std::time::Duration;

use slipway_fuzz::{
    archive, config, content_range, extremes, gitlab, guest_frame, masking, paths, pipeline,
    plugin_reply,
};

const TIME: Duration = Duration::from_secs(3);

macro_rules! target {
    ($name:ident, $ty:ty, $check:path) => {
        #[test]
        fn $name() {
            bolero::check!()
                .with_type::<$ty>()
                .with_test_time(TIME)
                .for_each($check);
        }
    };
}

target!(pipeline_yaml, pipeline::Input, pipeline::check);
target!(config_toml, config::Input, config::check);
target!(plugin_config, config::Input, config::check_plugin);
target!(gitlab_replies, gitlab::Input, gitlab::check);
target!(plugin_replies, plugin_reply::Input, plugin_reply::check);
target!(guest_frames, guest_frame::Input, guest_frame::check);
target!(archives, archive::Input, archive::check);
target!(archive_extraction, archive::Input, archive::check_extract);
target!(cache_keys_and_artifact_paths, paths::Input, paths::check);
target!(masked_output, masking::Input, masking::check);
target!(values_at_their_extremes, extremes::Input, extremes::check);
target!(
    content_range_headers,
    content_range::Input,
    content_range::check
);

#[test]
fn plugin_process() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_slipway-fuzz-plugin"));
    bolero::check!()
        .with_type::<slipway_fuzz::plugin_process::Input>()
        .with_test_time(TIME)
        .for_each(|input| slipway_fuzz::plugin_process::check(bin, input));
}
