"""The client connection: the first protocol (``fastpath``) and the lane of answers written
whole (``lane``), over the flow control and writer of ``proxy.wire.seam``."""
