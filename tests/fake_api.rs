//! TODO(helper): fake_api
