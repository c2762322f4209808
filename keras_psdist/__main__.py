"""`python -m keras_psdist COMMAND [--flags]`: same as the `keras-psdist` script."""

from keras_psdist.cli import run

if __name__ == "__main__":
    run()
