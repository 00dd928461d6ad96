package org.cellm;

import java.util.ArrayList;
import java.util.List;

/**
 * A conversation on an engine ({@link Engine#newSession}) that keeps the KV cache of its
 * earlier turns, so a new message computes only its own tokens. Each {@link #send} is a
 * turn; the reply joins the history when it finishes. One turn at a time, and one thread
 * at a time uses a session.
 */
public final class ChatSession implements AutoCloseable {
    private final Engine engine;
    private final GenerationOptions defaults;
    private long handle;

    ChatSession(Engine engine, long handle, GenerationOptions defaults) {
        this.engine = engine;
        this.handle = handle;
        this.defaults = defaults;
    }

    /** Sends a user message; the reply streams to {@code listener} (may be null). */
    public Generation send(String content, TokenListener listener) {
        return send(content, null, listener);
    }

    /** As {@link #send(String, TokenListener)}, with this turn's own options. */
    public synchronized Generation send(String content, GenerationOptions options,
            TokenListener listener) {
        if (content == null) throw new CellmException(CellmException.INVALID_ARG, "no message");
        return engine.submit(handleLocked(), content, null, null,
                options != null ? options : defaults, listener);
    }

    /** The conversation so far (not while a turn runs). */
    public synchronized List<ChatMessage> messages() {
        byte[][] v = Native.sessionMessages(handleLocked());
        List<ChatMessage> out = new ArrayList<>();
        for (int i = 0; i + 1 < v.length; i += 2)
            out.add(new ChatMessage(Native.text(v[i]), Native.text(v[i + 1])));
        return out;
    }

    private long handleLocked() {
        if (handle == 0) throw new CellmException(CellmException.INVALID_ARG, "the session is closed");
        return handle;
    }

    /** Frees the session; a turn still running is cancelled. */
    @Override
    public void close() {
        Native.refuseInCallback("ChatSession.close()");
        synchronized (this) {
            if (handle == 0) return;
            Native.sessionFree(handle);
            handle = 0;
        }
        engine.forget(this);
    }
}
