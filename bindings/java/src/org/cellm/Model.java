package org.cellm;

import java.util.ArrayList;
import java.util.List;

/**
 * A GGUF model file loaded for inference: its weights are mapped read-only (never copied),
 * with its tokenizer and chat template. Any number of engines may share one model. Close it
 * when done (closing twice is harmless); closing it first closes the engines made from it.
 */
public final class Model implements AutoCloseable {
    private long handle;
    private final List<Engine> engines = new ArrayList<>();

    /** Loads the model at {@code path} with its own chat template. */
    public Model(String path) {
        this(path, null);
    }

    /**
     * Loads the model at {@code path}. {@code chatTemplate}: null for the model's own
     * template, "chatml", "gemma" or "llama3" for a built-in format, or a Jinja template.
     *
     * @throws CellmException when the file cannot be opened or is not a model cellm can run
     *     (the message names the file and the fault)
     */
    public Model(String path, String chatTemplate) {
        handle = Native.modelLoad(Native.utf8(path), Native.utf8(chatTemplate));
    }

    /** The version of the native library, "MAJOR.MINOR.PATCH". */
    public static String version() {
        return Native.text(Native.version());
    }

    /** The handle, for an engine being made; the caller holds this model's lock. */
    long handleLocked() {
        if (handle == 0) throw new CellmException(CellmException.INVALID_ARG, "the model is closed");
        return handle;
    }

    synchronized void adopt(Engine e) {
        engines.add(e);
    }

    synchronized void forget(Engine e) {
        engines.remove(e);
    }

    /** Closes the engines made from this model, then frees it. */
    @Override
    public void close() {
        Native.refuseInCallback("Model.close()");
        List<Engine> open;
        long h;
        synchronized (this) {
            if (handle == 0) return;
            h = handle;
            handle = 0;
            open = new ArrayList<>(engines);
        }
        for (Engine e : open) e.close();
        Native.modelFree(h);
    }
}
