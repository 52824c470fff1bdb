"""Services: the federation operations (submit, cancel, tick) over the store, backends and peers."""
