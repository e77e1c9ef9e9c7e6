"""The sections of the pipeline config (data, evaluate, train), below everything that reads them."""
