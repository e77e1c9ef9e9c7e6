"""``python -m stateloop.tracking [URI]``: open a store that was moved or copied (default: the
one :func:`~stateloop.tracking.store.tracking_uri` chooses), re-pointing its artifact locations at
its new place (:func:`~stateloop.tracking.store.client`), and print its URI."""

from stateloop.tracking.store import client, tracking_uri

if __name__ == "__main__":  # python -m stateloop.tracking [URI]: open (and re-point) a moved store
    import sys

    print(client(sys.argv[1] if len(sys.argv) > 1 else tracking_uri()).tracking_uri)
