//! TODO(helper): exporter_vectors
