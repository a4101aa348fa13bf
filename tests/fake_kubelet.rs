//! TODO(helper): fake_kubelet
