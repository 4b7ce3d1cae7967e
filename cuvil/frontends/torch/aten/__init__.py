"""The ATen -> Cuvil op mappings, one module per concept (elementwise, tensor, reduce, nn, and their
shared helpers in common); ``cuvil.frontends.torch`` imports every module here, which registers them."""
