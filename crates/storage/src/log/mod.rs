//! Offset-allocator log backend (being built): one preallocated data file, space managed by an
//! offset allocator, checksummed records, checkpoint + scan recovery.
