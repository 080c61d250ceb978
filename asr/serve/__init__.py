"""`asr serve`: live recognition over WebSocket (`server.LiveServer`) and its microphone page."""
