package org.cellm;

import java.nio.charset.StandardCharsets;

/**
 * The native methods (jni/cellm_jni.c) and the loading of libcellm_jni. Strings cross as
 * UTF-8 byte arrays. Handles are the C pointers as longs; the classes that hold them make
 * sure each is used only while it is alive.
 */
final class Native {
    static {
        // -Dcellm.jni.library=/path/to/libcellm_jni.so, else java.library.path (on Android
        // the .so the app ships in its jniLibs).
        String path = System.getProperty("cellm.jni.library");
        if (path != null && !path.isEmpty()) {
            System.load(new java.io.File(path).getAbsolutePath());
        } else {
            System.loadLibrary("cellm_jni");
        }
    }

    private Native() {}

    /** Set on a thread while it runs a listener, where waiting calls would deadlock. */
    static final ThreadLocal<Boolean> IN_CALLBACK = ThreadLocal.withInitial(() -> false);

    static void refuseInCallback(String what) {
        if (IN_CALLBACK.get()) {
            throw new CellmException(CellmException.INVALID_ARG, what
                    + " cannot be called from a TokenListener (it runs on the engine thread);"
                    + " call cancel() there instead");
        }
    }

    static byte[] utf8(String s) {
        return s == null ? null : s.getBytes(StandardCharsets.UTF_8);
    }

    static byte[][] utf8(String[] v) {
        if (v == null) return null;
        byte[][] out = new byte[v.length][];
        for (int i = 0; i < v.length; i++) {
            if (v[i] == null) throw new CellmException(CellmException.INVALID_ARG, "a null string");
            out[i] = utf8(v[i]);
        }
        return out;
    }

    static String text(byte[] b) {
        return new String(b, StandardCharsets.UTF_8);
    }

    static native byte[] version();

    static native long modelLoad(byte[] path, byte[] chatTemplate);

    static native void modelFree(long model);

    static native long engineCreate(long model, int threads, long budget, int maxCtx, int maxSeqs);

    static native void engineFree(long engine);

    static native long engineTrim(long engine, int level);

    static native long submit(long engine, long session, Generation gen, byte[] prompt,
            byte[][] roles, byte[][] contents, int[] ints, float[] floats, long seed,
            byte[][] stop);

    static native void cancel(long req);

    static native int[] await(long req);

    static native byte[] requestError(long req);

    static native void requestFree(long req);

    /** Native requests allocated and not yet freed (for the tests). */
    static native long liveRequests();

    static native long sessionCreate(long engine, byte[] system, int[] ints, float[] floats,
            long seed);

    static native void sessionFree(long session);

    static native byte[][] sessionMessages(long session);
}
