"""What meshrun's tests share, one module per concern: running `meshrun`, building specs, spawning
gloo ranks and their rank-side checks, small models, corpora and run dirs, readers of what runs
write. A test imports from here, never from another test module."""
