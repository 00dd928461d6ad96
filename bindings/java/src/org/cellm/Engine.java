package org.cellm;

import java.util.ArrayList;
import java.util.List;

/**
 * Serves generations on a model: any number at once, from any thread, batched by the
 * engine's own thread into shared forward passes. Its memory (KV cache and activations) is
 * allocated once, within the budget. Close it when done; closing it cancels and frees the
 * generations and sessions still open on it. All methods are thread-safe.
 */
public final class Engine implements AutoCloseable {
    /** Engine settings; 0 leaves the library's default. */
    public static final class Options {
        int threads, maxContext, maxSequences;
        long memoryBudgetBytes;

        /** Compute threads (default: the cores, at most 4). */
        public Options threads(int n) {
            threads = n;
            return this;
        }

        /** KV cache and activations together (default 256 MiB). */
        public Options memoryBudgetBytes(long bytes) {
            memoryBudgetBytes = bytes;
            return this;
        }

        /** Positions per generation, prompt included (default: the model's, at most 4096). */
        public Options maxContext(int n) {
            maxContext = n;
            return this;
        }

        /** Generations running at once (default 16; more wait in a queue). */
        public Options maxSequences(int n) {
            maxSequences = n;
            return this;
        }
    }

    private final Model model;
    private long handle;
    private final List<Generation> generations = new ArrayList<>();
    private final List<ChatSession> sessions = new ArrayList<>();

    public Engine(Model model) {
        this(model, new Options());
    }

    /** @throws CellmException for a setting out of range or a budget too small */
    public Engine(Model model, Options o) {
        this.model = model;
        synchronized (model) {
            handle = Native.engineCreate(model.handleLocked(), o.threads, o.memoryBudgetBytes,
                    o.maxContext, o.maxSequences);
            model.adopt(this);
        }
    }

    /** Continues {@code prompt} as plain text, streaming to {@code listener} (may be null). */
    public Generation generate(String prompt, GenerationOptions options, TokenListener listener) {
        if (prompt == null) throw new CellmException(CellmException.INVALID_ARG, "no prompt");
        return submit(0, prompt, null, null, options, listener);
    }

    /** The assistant's reply to {@code messages}, laid out with the model's chat template. */
    public Generation chat(List<ChatMessage> messages, GenerationOptions options,
            TokenListener listener) {
        String[] roles = new String[messages.size()];
        String[] contents = new String[messages.size()];
        for (int i = 0; i < roles.length; i++) {
            roles[i] = messages.get(i).role();
            contents[i] = messages.get(i).content();
        }
        return submit(0, null, roles, contents, options, listener);
    }

    /**
     * A chat session, which keeps the KV cache of its earlier turns.
     *
     * @param system the system prompt, or null
     * @param defaults each turn's sampling and maxTokens, or null for the defaults
     */
    public ChatSession newSession(String system, GenerationOptions defaults) {
        GenerationOptions o = defaults != null ? defaults : new GenerationOptions();
        synchronized (this) {
            ChatSession s = new ChatSession(this, Native.sessionCreate(handleLocked(),
                    Native.utf8(system), o.ints(), o.floats(), o.seed), o);
            sessions.add(s);
            return s;
        }
    }

    /** {@link #trim} levels (cellm_trim_level); each does what the ones before it do. */
    public static final int TRIM_LIGHT = 1; // free KV pages go back to the OS
    public static final int TRIM_MODERATE = 2; // also the KV cache sessions keep between turns
    public static final int TRIM_CRITICAL = 3; // also running generations' (recomputed later)

    /**
     * Gives memory back under pressure, for Android's onTrimMemory (RUNNING_MODERATE or
     * UI_HIDDEN: TRIM_LIGHT; RUNNING_LOW or BACKGROUND: TRIM_MODERATE; RUNNING_CRITICAL or
     * COMPLETE: TRIM_CRITICAL). No output changes. Returns the bytes given back to the OS.
     */
    public synchronized long trim(int level) {
        // Under the lock, so close() cannot free the engine during the trim.
        return Native.engineTrim(handleLocked(), level);
    }

    Generation submit(long session, String prompt, String[] roles, String[] contents,
            GenerationOptions options, TokenListener listener) {
        GenerationOptions o = options != null ? options : new GenerationOptions();
        Generation g = new Generation(this, listener);
        synchronized (this) {
            long req = Native.submit(handleLocked(), session, g, Native.utf8(prompt),
                    Native.utf8(roles), Native.utf8(contents), o.ints(), o.floats(), o.seed,
                    Native.utf8(o.stop));
            g.attach(req);
            generations.add(g);
        }
        return g;
    }

    private long handleLocked() {
        if (handle == 0) throw new CellmException(CellmException.INVALID_ARG, "the engine is closed");
        return handle;
    }

    synchronized void forget(Generation g) {
        generations.remove(g);
    }

    synchronized void forget(ChatSession s) {
        sessions.remove(s);
    }

    /** Cancels and frees what is still open on this engine, then stops it. */
    @Override
    public void close() {
        Native.refuseInCallback("Engine.close()");
        List<Generation> gs;
        List<ChatSession> ss;
        long h;
        synchronized (this) {
            if (handle == 0) return;
            h = handle;
            handle = 0;
            gs = new ArrayList<>(generations);
            ss = new ArrayList<>(sessions);
        }
        for (Generation g : gs) g.cancel(); // all at once: they end in one step
        for (Generation g : gs) g.close();
        for (ChatSession s : ss) s.close();
        Native.engineFree(h);
        model.forget(this);
    }
}
