"""The client connection: the first protocol (``fastpath``), the lane of answers written whole
(``lane``) and aiohttp's writer made transparent (``writer``)."""
